import re

import pytest
import yaml

import models
import tasks
from pipeline.common import config
from pipeline.search.cells import check_architectures
from tests.helpers import ROOT, write_params
from tests.helpers.without import run_without


@pytest.mark.parametrize("profile", config.profiles())
def test_every_profile_validates_and_builds_every_model_of_its_grid(profile):
    cfg = config.load_config(profile=profile)
    assert cfg.profile == profile and cfg.sweep_datasets()
    for task, size in cfg.sweep_datasets():
        task_obj = tasks.get_task(task, size, **cfg.generate.task_params.get(task, {}))
        for arch in cfg.sweep.grid.architectures_for(task):  # the smallest width, to keep it fast at paper sizes
            models.build_model(arch, vocab_size=task_obj.vocab_size, width=min(cfg.sweep.grid.widths_for(arch)),
                               depth=min(cfg.sweep.grid.depths_for(arch)), heads=cfg.sweep.model.heads, max_len=64,
                               **cfg.sweep.grid.arch_options.get(arch, {}))


def test_params_yaml_gives_every_registered_task_a_generate_stage():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert sorted(params["tasks"]) == sorted(tasks.TASKS)
    assert params["profile"] in config.profiles()


@pytest.mark.parametrize("params", sorted((ROOT / "benchmarks").glob("*.yaml")), ids=lambda p: p.name)
def test_every_params_file_the_benchmarks_keep_loads(params):
    """The pilot's and the claims run's inputs wait for a lent GPU: they must load when one comes."""
    cfg = config.load_config(params)
    check_architectures(cfg)
    assert cfg.sweep_datasets()


def test_paper_profile_declares_both_papers_data_and_the_dp_papers_grid():
    cfg = config.load_config(profile="paper")
    separations = config.load_config(profile="separations")
    dp = {"arithmetic": [6, 10, 13, 16], "ed": [6, 12, 16, 20], "ed_local": [6, 12, 16, 20], "lis": [40, 110, 175, 250]}
    assert cfg.generate.datasets == dp | separations.generate.datasets
    for task in dp:
        gen = cfg.generate.for_task(task)
        assert (gen.train_samples, gen.test_samples, gen.unique) == (1_000_000, 100_000, True)
    for task in separations.generate.datasets:
        gen = cfg.generate.for_task(task)
        assert (gen.train_samples, gen.test_samples, gen.unique) == (1_000_000, 5_000, False)
    assert cfg.sweep.grid.datasets == dp and cfg.generate.seed == 2023
    assert cfg.sweep.grid.widths == [32, 64, 128, 256, 512, 1024] and cfg.sweep.grid.depths == [3, 5]
    assert cfg.sweep.optim.batch_size == 512 and cfg.sweep.optim.epochs == 100
    assert cfg.sweep.resources.gpus_per_trial == 1
    assert sorted(cfg.sweep.grid.architectures) == ["linear", "sparse", "standard"]


def test_paper_faithful_is_paper_but_the_cells_no_figure_shows():
    """conf/paper-faithful.yaml is conf/paper.yaml key for key, but for the cells it leaves out."""
    faithful, paper = (yaml.safe_load((ROOT / "conf" / f"{p}.yaml").read_text()) for p in ("paper-faithful", "paper"))
    own = {k: faithful["sweep"]["grid"].pop(k) for k in ("exclude", "task_architectures")}
    assert faithful == paper and own["task_architectures"] == {"ed_local": ["sparse", "linear"]}
    cfg = config.load_config(profile="paper-faithful")
    grid = set(cfg.sweep.grid.cells(cfg.sweep_datasets()))
    assert len(grid) == 60 + 144 + 72 + 48  # arithmetic d3 to 512; ED d3 and d5; LIS d3; ED_Local sparse, linear d3
    assert {(t, d) for t, _, _, _, d in grid} == {("arithmetic", 3), ("ed", 3), ("ed", 5), ("lis", 3), ("ed_local", 3)}
    assert max(w for t, _, _, w, _ in grid if t == "arithmetic") == 512
    assert all(tasks.TASKS[t].paper_sizes == tuple(cfg.sweep.grid.datasets[t]) for t in cfg.sweep.grid.datasets)


def test_a_grid_leaves_out_the_cells_exclude_matches_and_a_misspelt_name_is_named(tmp_path):
    base = "profile: tiny\ntasks: [arithmetic, lis]\n"
    excluded = base + "sweep: {grid: {exclude: [{depths: [1], tasks: [lis]}]}}"
    cfg = config.load_config(write_params(tmp_path / "p.yaml", excluded))
    every = config.load_config(profile="tiny")
    kept, whole = cfg.sweep.grid.cells(cfg.sweep_datasets()), every.sweep.grid.cells(every.sweep_datasets())
    assert set(kept) == {c for c in whole if not (c[0] == "lis" and c[4] == 1)} and len(kept) < len(whole)
    with pytest.raises(config.ConfigError, match=r"sweep.grid.exclude\[0\].tasks: 'lsi' is not allowed"):
        config.load_config(write_params(tmp_path / "q.yaml", base + "sweep: {grid: {exclude: [{tasks: [lsi]}]}}"))
    typo = config.load_config(write_params(tmp_path / "t.yaml",
                                           base + "sweep: {grid: {exclude: [{architectures: [lstn]}]}}"))
    with pytest.raises(config.ConfigError, match=r"sweep.grid.exclude\[0\].architectures: 'lstn' is not allowed"):
        check_architectures(typo)  # the sweep stage's check, before any compute
    with pytest.raises(config.ConfigError, match="sweep.grid.exclude.0.task: Extra inputs are not permitted"):
        config.load_config(write_params(tmp_path / "r.yaml", base + "sweep: {grid: {exclude: [{task: [lis]}]}}"))
    with pytest.raises(config.ConfigError, match="sweep.grid.exclude leaves no cell of the grid"):
        config.load_config(write_params(tmp_path / "s.yaml",
                                        base + "sweep: {grid: {exclude: [{tasks: [lis, arithmetic]}]}}"))


def test_separations_profile_declares_the_separations_papers_grid():
    cfg = config.load_config(profile="separations")
    lengths = [20, 50, 100, 200, 400]
    assert cfg.generate.datasets == {"index_lookup": lengths, "dyck": lengths, "eq_random": lengths,
                                     "eq_one": lengths, "eq_ncp": lengths + [800]}
    assert cfg.generate.train_samples == 1_000_000 and cfg.generate.test_samples == 5_000
    assert not cfg.generate.unique  # i.i.d., like the paper's online sampling
    assert cfg.sweep.grid.widths == [64, 128, 256, 512] and cfg.sweep.grid.depths == [1, 2, 4, 6]
    assert cfg.sweep.optim.batch_size == 64


def test_params_overrides_win_over_the_profile(tmp_path):
    p = write_params(tmp_path / "params.yaml",
                     "profile: tiny\ntasks: [arithmetic, lis]\nsweep: {grid: {seeds: [0, 1, 2]}}\n")
    cfg = config.load_config(p)
    assert cfg.sweep.grid.seeds == [0, 1, 2]
    assert cfg.sweep.grid.widths == config.load_config(profile="tiny").sweep.grid.widths


@pytest.mark.parametrize("override, message", [
    ("profile: nope",
     "profile: 'nope' is not allowed; allowed values: cpu-claims, cpu-repro, laptop, paper, paper-faithful, "
     "separations, tiny"),
    ("sweep: {grid: {architectures: [standard, transformerx]}}",
     "sweep.grid.architectures: 'transformerx' is not allowed; allowed values: "
     + ", ".join(sorted(models.ARCHITECTURES))),
    ("sweep: {grid: {widths: [16, 15]}}", "sweep.grid.widths: 15 is not divisible by sweep.model.heads = 2"),
    ("sweep: {grid: {widths: []}}", "sweep.grid.widths is empty"),
    ("sweep: {grid: {depths: [0]}}", "sweep.grid.depths.0: Input should be greater than 0"),
    ("generate: {datasets: {lis: [-4]}}", "generate.datasets.lis.0: Input should be greater than 0"),
    ("generate: {datasets: {sorting: [4]}}",
     "generate.datasets: 'sorting' is not allowed; allowed values: arithmetic, lis"),
    ("generate: {datasets: {lis: [2]}}", "generate.datasets.lis: lis size n must be >= 3"),
    ("generate: {task_params: {lis: {value_range: 5}}}", "value_range must be >= 2n \\+ 1"),
    ("generate: {per_task: {dyck: {unique: false}}}", "generate.per_task: 'dyck' is not allowed; allowed values: "
     "arithmetic, lis"),
    ("sweep: {grid: {arch_depths: {rnn: [1, 2]}}}", "sweep.grid.arch_depths: 'rnn' is not allowed; allowed values: "
     + ", ".join(sorted(models.ARCHITECTURES))),
    ("sweep: {grid: {arch_depths: {lstm: []}}}", "sweep.grid.arch_depths.lstm is empty"),
    ("sweep: {grid: {datasets: {lis: [99]}}}", "sweep.grid.datasets.lis: 99 is not allowed"),
    ("sweep: {learning_rate: 0.1}", "sweep.learning_rate: Extra inputs are not permitted"),
    ("sweep: {grid: {arch_options: {sparse: {window: 3}}}}", "sweep.grid.arch_options.sparse: unknown option"),
    ("tasks: [arithmetic, lis, sorting]", "tasks: 'sorting' is not allowed"),
    ("sweep: {search: {lr: .inf}}", "sweep.search.lr: Input should be a finite number"),
    ("sweep: {optim: {max_steps: 0}}", "sweep.optim.max_steps: 0 trains nothing"),
    ("sweep: {optim: {grad_clip: -1}}", "sweep.optim.grad_clip: Input should be greater than 0"),
    ("sweep: {search: {lrs: []}}", "sweep.search.lrs is empty"),
    ("sweep: {search: {lrs: [0.01, 0.01]}}", "sweep.search.lrs: \\[0.01, 0.01\\] must be positive and distinct"),
    ("sweep: {search: {lr: 0.01, lrs: [0.1]}}", "sweep.search.lr and sweep.search.lrs are both set"),
    ("sweep: {verdict: {patience: 0}}", "sweep.verdict.patience: Input should be greater than 0"),
    ("sweep: {verdict: {max_budget_factor: 0}}",
     "sweep.verdict.max_budget_factor: Input should be greater than or equal to 1"),
    ("sweep: {verdict: {max_budget_factor: 1.5}}", "sweep.verdict.max_budget_factor: Input should be a valid integer"),
    ("sweep: {verdict: {convergence_window: 1}}", "sweep.verdict.convergence_window: Input should be less than 1"),
    ("sweep: {verdict: {convergence_window: 0}}", "sweep.verdict.convergence_window: Input should be greater than 0"),
    ("sweep: {verdict: {convergence_tolerance: -0.1}}",
     "sweep.verdict.convergence_tolerance: Input should be greater than 0"),
    ("sweep: {verdict: {convergence_min_steps: 0}}",
     "sweep.verdict.convergence_min_steps: Input should be greater than 0"),
    ("sweep: {plateau_checks: 5}", "sweep.plateau_checks"),
    ("sweep: {resources: {cpus_per_trial: 100000}}",
     "sweep.resources.cpus_per_trial: Input should be less than or equal to 1024"),
    ("generate: {chunk_size: 100000000}", "generate.chunk_size: Input should be less than or equal to 1048576"),
    ("sweep: {grid: {widths: [16]}, search: {strategy: frontier}}",
     "sweep.grid.widths: \\[16\\] is a single width; sweep.search.strategy: frontier"),
    ("sweep: {grid: {widths: [16, 8]}}", "sweep.grid.widths: \\[16, 8\\] must be strictly increasing"),
    ("sweep: {grid: {widths: [8, 8, 16]}}", "sweep.grid.widths: \\[8, 8, 16\\] must be strictly increasing"),
    ("sweep: {grid: {arch_widths: {lstm: [32, 16]}}}",
     "sweep.grid.arch_widths.lstm: \\[32, 16\\] must be strictly increasing"),
    ("sweep: {search: {arch_lrs: {lstm: []}}}", "sweep.search.arch_lrs.lstm is empty"),
    ("sweep: {grid: {task_architectures: {dyck: [lstm]}}}",
     "sweep.grid.task_architectures: 'dyck' is not allowed; allowed "
                                                    "values: arithmetic, lis"),
    ("sweep: {grid: {task_architectures: {lis: [rnn]}}}",
     "sweep.grid.task_architectures.lis: 'rnn' is not allowed; allowed "
                                                  "values: dss, linear,"),
    ("sweep: {grid: {task_architectures: {lis: []}}}", "sweep.grid.task_architectures.lis is empty"),
    ("sweep: {search: {strategy: bisect}}", "sweep.search.strategy: Input should be 'grid' or 'frontier'"),
    ("sweep: {resources: {gpus_per_trial: 1.5}}",
     "sweep.resources.gpus_per_trial: 1.5 -- above 1 it counts whole GPUs"),
    ("sweep: {resources: {gpus_per_trial: 2, workers_per_trial: 3}}", "each data-parallel worker takes one GPU, so "
                                                         "workers_per_trial is 2"),
    ("sweep: {resources: {gpus_per_trial: 0.5, workers_per_trial: 2}}", "data-parallel workers need a GPU each"),
    ("sweep: {resources: {workers_per_trial: 3}}", "sweep.optim.batch_size: 32 does not split evenly over 3"),
    ("sweep: {runs: {max_failures: -1}}", "sweep.runs.max_failures: Input should be greater than or equal to 0"),
    ("report: {accuracy_threshold: 1.0}", "report.accuracy_threshold: Input should be less than 1"),
    ("report: {accuracy_threshold: 0}", "report.accuracy_threshold: Input should be greater than 0"),
    # a section that is not a mapping
    ("sweep: 5", "params.yaml: sweep: 5 is not allowed; allowed: a mapping of sweep keys \\(or null\\)"),
    ("cluster: [x]", "params.yaml: cluster: \\['x'\\] is not allowed; allowed: a mapping of cluster keys"),
    # architecture options, by the types and ranges each architecture declares
    ("sweep: {grid: {arch_options: {sparse: {block: 0}}}}",
     "sweep.grid.arch_options.sparse.block: 0 is not allowed for 'sparse'; "
                                                    "allowed: int >= 1, or null \\(B from the sequence length\\)"),
    ("sweep: {grid: {arch_options: {sparse: {block: true}}}}",
     "sweep.grid.arch_options.sparse.block: True is not allowed"),
    ("sweep: {grid: {arch_options: {sparse: {k: null}}}}",
     "sweep.grid.arch_options.sparse.k: None is not allowed for 'sparse'; "
                                                   "allowed: int >= 1$"),
    ("sweep: {grid: {arch_options: {linear: {chunk: -1}}}}",
     "sweep.grid.arch_options.linear.chunk: -1 is not allowed for "
                                                     "'linear'; allowed: int >= 1"),
    ("sweep: {grid: {arch_options: {sliding_window: {window: x}}}}",
     "sweep.grid.arch_options.sliding_window.window: 'x' is not "
                                                             "allowed for 'sliding_window'; allowed: int >= 1"),
    ("sweep: {grid: {arch_options: {mamba: {conv: 1}}}}",
     "sweep.grid.arch_options.mamba.conv: 1 is not allowed for 'mamba'; "
                                                  "allowed: int >= 2"),
    ("sweep: {grid: {arch_options: {sinks: {sinks: 2.5}}}}",
     "sweep.grid.arch_options.sinks.sinks: 2.5 is not allowed for "
                                                     "'sinks'; allowed: int >= 0"),
    # memory: micro-batches of at least one sample, a positive budget
    ("sweep: {optim: {batch_size: 8}, resources: {micro_batches: 9}}",
     "sweep.resources.micro_batches: 9 is more than the 8 samples of a worker's batch"),
    ("sweep: {resources: {memory_gb_per_trial: 0}}",
     "sweep.resources.memory_gb_per_trial: Input should be greater than 0"),
    # no lax coercion: a bool is not an int, a string not a number, an int not a bool
    ("sweep: {model: {heads: true}}", "sweep.model.heads: Input should be a valid integer \\(got True\\)"),
    ("sweep: {evaluation: {eval_batch_size: true}}",
     "sweep.evaluation.eval_batch_size: Input should be a valid integer \\(got True\\)"),
    ("sweep: {optim: {epochs: '5'}}", "sweep.optim.epochs: Input should be a valid integer \\(got '5'\\)"),
    ("sweep: {model: {dropout: false}}", "sweep.model.dropout: Input should be a valid number \\(got False\\)"),
    ("generate: {unique: 1}", "generate.unique: Input should be a valid boolean \\(got 1\\)"),
    ("nightly: {throughput_drop: true}", "nightly.throughput_drop: Input should be a valid number \\(got True\\)"),
    # no infinities or NaNs: they pass a bound such as ge=0 and break the arithmetic after it
    ("sweep: {optim: {weight_decay: .inf}}", "sweep.optim.weight_decay: Input should be a finite number \\(got inf\\)"),
    ("sweep: {resources: {gpus_per_trial: .inf}}",
     "sweep.resources.gpus_per_trial: Input should be a finite number \\(got inf\\)"),
    ("nightly: {accuracy_drop: .nan}", "nightly.accuracy_drop: Input should be a finite number \\(got nan\\)"),
    ("report: {accuracy_threshold: .nan}", "report.accuracy_threshold: Input should be a finite number"),
    # no empty names
    ("sweep: {runs: {experiment: ''}}", "sweep.runs.experiment: Input should be a non-blank string \\(got ''\\)"),
    ("nightly: {history: ' '}", "nightly.history: Input should be a non-blank string \\(got ' '\\)"),
    ("cluster: {storage_path: ''}", "cluster.storage_path: Input should be a non-blank string \\(got ''\\)"),
    ("cluster: {mlflow_tracking_uri: ''}", "cluster.mlflow_tracking_uri: Input should be a non-blank string"),
    ("cluster: {ray_address: '  '}", "cluster.ray_address: Input should be a non-blank string \\(got '  '\\)"),
    # seeds and workers
    ("generate: {seed: -1}", "generate.seed: Input should be greater than or equal to 0 \\(got -1\\)"),
    ("sweep: {grid: {seeds: [0, -1]}}", "sweep.grid.seeds.1: Input should be greater than or equal to 0 \\(got -1\\)"),
    ("sweep: {grid: {seeds: [4294967296]}}", "sweep.grid.seeds.0: Input should be less than or equal to 4294967295"),
    ("generate: {workers: 1000}", "generate.workers: 1000 is more than 64 processes; allowed: 1 to 64 \\(the files "
                                  "are byte-identical for any number"),
    ("generate: {workers: 0}", "generate.workers: Input should be greater than 0 \\(got 0\\)"),
    # repeats, and validation that would never run
    ("sweep: {grid: {seeds: [0, 0]}}", "sweep.grid.seeds: \\[0, 0\\] has repeats; allowed: distinct values"),
    ("sweep: {grid: {depths: [1, 1]}}", "sweep.grid.depths: \\[1, 1\\] has repeats"),
    ("sweep: {grid: {arch_depths: {lstm: [2, 2]}}}", "sweep.grid.arch_depths.lstm: \\[2, 2\\] has repeats"),
    ("sweep: {grid: {architectures: [lstm, lstm]}}", "sweep.grid.architectures: \\['lstm', 'lstm'\\] has repeats"),
    ("generate: {datasets: {lis: [3, 3]}}", "generate.datasets.lis: \\[3, 3\\] has repeats"),
    ("tasks: [arithmetic, lis, lis]", "tasks: \\['arithmetic', 'lis', 'lis'\\] has repeats"),
    ("sweep: {evaluation: {eval_batch_size: 0}}",
     "sweep.evaluation.eval_batch_size: Input should be greater than 0 \\(got 0\\)"),
    ("sweep: {evaluation: {val_every_steps: 0}}",
     "sweep.evaluation.val_every_steps: Input should be greater than 0 \\(got 0\\)"),
    ("sweep: {evaluation: {val_every_steps: 9}}",
     "sweep.evaluation.val_every_steps: 9 is more than sweep.optim.max_steps = 8: a trial would never "
                                    "validate"),
    # a validation split smaller than a validation scores, or larger than the test distribution holds
    ("sweep: {evaluation: {val_samples: 64}}",
     "sweep.evaluation.val_samples: 64 is more than the 32 validation samples generate.val_samples "
                                 "makes for arithmetic"),
    ("generate: {per_task: {lis: {val_samples: 16}}}",
     "sweep.evaluation.val_samples: 32 is more than the 16 validation samples "
                                                       "generate.val_samples makes for lis"),
    ("generate: {val_samples: 0}", "generate.val_samples: Input should be greater than 0"),
    ("generate: {val_samples: 100000}", "generate.datasets.arithmetic: arithmetic size 2: 100040 distinct test \\+ "
                                        "val samples asked, but the space"),
    ("nightly: {accuracy_drop: 1.5}", "nightly.accuracy_drop: Input should be less than or equal to 1"),
    # successive halving and predictions
    ("sweep: {search: {lr_search: halving, halving_rungs: [4], halving_keep: 1.0}}",
     "sweep.search.halving_keep: Input should be less than 1 \\(got 1.0\\)"),
    ("sweep: {search: {lr_search: halving, halving_rungs: [4], halving_keep: 0}}",
     "sweep.search.halving_keep: Input should be greater than 0"),
    ("sweep: {search: {lr_search: halving, halving_rungs: [4, 4]}}",
     "sweep.search.halving_rungs: \\[4, 4\\] must increase"),
    ("sweep: {search: {lr_search: halving}}",
     "sweep.search.halving_rungs is empty: sweep.search.lr_search: halving needs the steps"),
    ("sweep: {search: {lr_search: halving, halving_rungs: [6]}}",
     "must be multiples of sweep.evaluation.val_every_steps = 4"),
    ("sweep: {search: {lr_search: halving, halving_rungs: [8]}}",
     "must end below the first step budget sweep.optim.max_steps = 8"),
    ("sweep: {search: {lr_search: quartering}}", "sweep.search.lr_search: Input should be 'all' or 'halving'"),
    ("sweep: {search: {lr_search: halving, halving_rungs: [4], halving_unguided: drop}}",
     "sweep.search.halving_unguided: Input should be 'keep' or 'rank'"),
    ("sweep: {search: {strategy: frontier, predict: [sizes, tea_leaves]}}",
     "sweep.search.predict.1: Input should be 'sizes', 'seeds' "
                                                                "or 'neighbours' \\(got 'tea_leaves'\\)"),
    ("sweep: {search: {strategy: grid, predict: [sizes]}}",
     "sweep.search.predict: \\['sizes'\\] needs sweep.search.strategy: frontier"),
    ("sweep: {resources: {fuse: seeds}}", "sweep.resources.fuse: Input should be 'off' or 'learning_rates'"),
    ("sweep: {resources: {fuse: learning_rates, workers_per_trial: 2}}",
     "sweep.resources.fuse: learning_rates trains a cell's learning rates in one process; with 2 data-parallel "
     "workers"),
    ("sweep: {optim: {precision: 16-mixed}, resources: {fuse: learning_rates, gpus_per_trial: 1}}",
     "sweep.resources.fuse: learning_rates with sweep.optim.precision: 16-mixed: the gradient scaler skips a step "
     "for every member"),
])
def test_bad_params_are_rejected_with_the_key_and_allowed_values(tmp_path, override, message):
    base = {"profile": "tiny", "tasks": ["arithmetic", "lis"]}
    base.update(yaml.safe_load(override))
    p = write_params(tmp_path / "params.yaml", yaml.safe_dump(base))
    with pytest.raises(config.ConfigError, match=message):
        check_architectures(config.load_config(p))  # as the sweep stage checks it


@pytest.mark.parametrize("override, blocked, message", [
    ("sweep: {max_steps: 3}", "torch,ray,lightning,mlflow", "sweep.max_steps moved to sweep.optim.max_steps"),
    ("sweep: {grid: {architectures: [standard, transformr]}}", "ray,lightning,mlflow",
     "sweep.grid.architectures: 'transformr' is not allowed"),
])
def test_the_sweep_stage_names_a_bad_setting_before_it_imports_ray_mlflow_and_lightning(tmp_path, override,
                                                                                        blocked, message):
    """Seconds of imports (Ray, MLflow, Lightning; torch for the architectures) come after the settings are checked:
    the stage runs with those packages refused, and still names the setting."""
    base = {"profile": "tiny", "tasks": ["arithmetic", "lis"]} | yaml.safe_load(override)
    p = write_params(tmp_path / "params.yaml", yaml.safe_dump(base))
    done = run_without("pipeline.sweep", "--params", str(p), "--out", str(tmp_path / "results"), blocked=blocked,
                       timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr


@pytest.mark.parametrize("text, line", [
    ("profile: tiny\ntasks: [arithmetic, lis]\nsweep: {grid: {seeds: [0, 1}}\n",
     "line 3, column 28: expected ',' or ']'"),
    ("profile: tiny\ntasks: [arithmetic, lis]\nsweep:\n  grid:\n    seeds: [0]\n     widths: [8]\n",
     "line 6, column 6"),
    ("profile: tiny\n\ttasks: [arithmetic, lis]\n", "line 2, column 1: found character '\\\\t'"),
])
def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path, text, line):
    p = write_params(tmp_path / "params.yaml", text)
    with pytest.raises(config.ConfigError, match=f"params.yaml: not valid YAML at {line}"):
        config.load_config(p)


@pytest.mark.parametrize("text, message", [
    ("sweep: {grid: {widths: [8, 16}}\n", "broken.yaml: not valid YAML at line 1, column 30"),
    ("sweep: 5\n", "broken.yaml: sweep: 5 is not allowed; allowed: a mapping of sweep keys"),
])
def test_a_broken_profile_names_its_file(tmp_path, monkeypatch, text, message):
    (tmp_path / "broken.yaml").write_text(text)
    monkeypatch.setattr(config, "CONF_DIR", tmp_path)
    p = write_params(tmp_path / "params.yaml", "profile: broken\ntasks: [arithmetic, lis]\n")
    with pytest.raises(config.ConfigError, match=message):
        config.load_config(p)


def test_yaml_ints_still_validate_where_numbers_are_expected(tmp_path):
    p = write_params(tmp_path / "params.yaml", "profile: tiny\ntasks: [arithmetic, lis]\nsweep: {model: {dropout: 0}, "
                     "resources: {gpus_per_trial: 0}, optim: {weight_decay: 1}, search: {lr: 1}, "
                     "grid: {seeds: [0, 4294967295]}}\nnightly: {accuracy_drop: 1}\ngenerate: {seed: 0, workers: 64}\n")
    cfg = config.load_config(p)
    s = cfg.sweep
    assert (s.model.dropout, s.search.lr, cfg.nightly.accuracy_drop, cfg.generate.workers) == (0.0, 1.0, 1.0, 64)


@pytest.mark.parametrize("resources, trial", [
    ({}, {"cpu": 1, "gpu": 0}),
    ({"gpus_per_trial": 0.25}, {"cpu": 1, "gpu": 0.25}),  # four small trials share a GPU
    ({"gpus_per_trial": 2, "cpus_per_trial": 3}, {"cpu": 6, "gpu": 2}),  # two data-parallel workers, a GPU each
    ({"workers_per_trial": 2}, {"cpu": 2, "gpu": 0}),  # the CPU twin: DDP over gloo
])
def test_a_trial_takes_every_workers_cpus_and_gpus_from_one_node(resources, trial):
    section = config.load_config(profile="tiny").sweep.resources.model_copy(update=resources)
    assert section.trial_resources() == trial


def test_cluster_settings_come_from_params_then_environment(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("CAPACITY_ATLAS_STORAGE", raising=False)
    default = config.ClusterConfig()
    assert default.ray() is None and default.mlflow() == f"sqlite:///{ROOT / 'mlflow.db'}"
    assert default.storage() == str(ROOT / "ray_results")
    monkeypatch.setenv("CAPACITY_ATLAS_STORAGE", "s3://bucket/atlas")
    assert default.storage() == "s3://bucket/atlas"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    assert default.ray() == "10.0.0.1:6379" and default.mlflow() == "http://mlflow:5000"
    explicit = config.ClusterConfig(ray_address="head:6379", mlflow_tracking_uri="sqlite:////x.db")
    assert explicit.ray() == "head:6379" and explicit.mlflow() == "sqlite:////x.db"


@pytest.mark.parametrize("copy", ["tmpk2x9", "standalone/tmpk2x9"])  # `dvc queue start`'s, `dvc exp run --temp`'s
def test_a_dvc_experiments_temporary_copy_keeps_its_stores_in_the_project(tmp_path, copy):
    project = tmp_path / "atlas"
    assert config.project_root(project) == project
    assert config.project_root(project / ".dvc" / "tmp" / "exps" / copy) == project
    assert config.project_root(project / ".dvc" / "tmp" / "exps") == project / ".dvc" / "tmp" / "exps"  # no copy


def test_an_architecture_may_have_its_own_depths(tmp_path, tiny_data):
    from pipeline.search.cells import build_cells

    p = write_params(tmp_path / "params.yaml", "profile: tiny\ntasks: [arithmetic, ed, ed_local, lis, index_lookup, "
                     "dyck, eq_random, eq_one, eq_ncp]\nsweep: {grid: {depths: [1, 2], arch_depths: {lstm: [3]}}}\n")
    cfg = config.load_config(p)
    cells = build_cells(cfg, tiny_data)
    assert {c.depth for c in cells if c.arch == "lstm"} == {3}
    assert {c.depth for c in cells if c.arch == "standard"} == {1, 2}
    per_depth = len(cfg.sweep.grid.widths) * len(cfg.sweep_datasets()) * len(cfg.sweep.grid.seeds)
    assert len(cells) == per_depth * (2 * (len(cfg.sweep.grid.architectures) - 1) + 1)


def test_an_architecture_may_have_its_own_widths_and_learning_rates(tmp_path, tiny_data):
    """A 1-layer transformer at 64 beside an LSTM at 64..256, in one sweep, without the transformer at 256."""
    from pipeline.search.cells import build_cells

    p = write_params(tmp_path / "params.yaml", "profile: tiny\ntasks: [arithmetic, lis]\nsweep: {grid: {architectures: "
                     "[transformer, lstm], widths: [64], depths: [1], arch_widths: {lstm: [64, 128, 256]}}, "
                     "search: {lrs: [0.001, 0.0003], arch_lrs: {lstm: [0.01]}}}\n")
    cells = build_cells(config.load_config(p), tiny_data)
    assert {c.width for c in cells if c.arch == "transformer"} == {64}
    assert {c.width for c in cells if c.arch == "lstm"} == {64, 128, 256}
    assert {v.lrs for c, v in cells.items() if c.arch == "lstm"} == {(0.01,)}
    assert {v.lrs for c, v in cells.items() if c.arch == "transformer"} == {(0.001, 0.0003)}


def test_each_task_may_train_its_own_architectures(tmp_path, tiny_data):
    """Each paper's models on its own tasks, in one sweep: the others train on every task."""
    from pipeline.search.cells import build_cells

    p = write_params(tmp_path / "params.yaml", "profile: tiny\ntasks: [arithmetic, lis]\nsweep: {grid: {architectures: "
                     "[standard, sparse, lstm], task_architectures: {lis: [lstm]}}}\n")
    cells = build_cells(config.load_config(p), tiny_data)
    assert {c.arch for c in cells if c.task == "lis"} == {"lstm"}
    assert {c.arch for c in cells if c.task == "arithmetic"} == {"standard", "sparse", "lstm"}


def test_datasets_overrides_replace_the_profiles_and_other_mappings_merge(tmp_path):
    p = write_params(tmp_path / "params.yaml", "profile: separations\ntasks: [index_lookup, dyck, eq_random, eq_one, "
                     "eq_ncp]\ngenerate: {datasets: {index_lookup: [20, 50]}, "
                     "per_task: {index_lookup: {test_samples: 100}}}\n"
                     "sweep: {grid: {arch_depths: {transformer: [1]}}}\n")
    cfg = config.load_config(p)
    assert cfg.generate.datasets == {"index_lookup": [20, 50]}  # replaced: the profile's 23 datasets are gone
    assert cfg.sweep.grid.arch_depths == {"lstm": [1, 2, 3], "transformer": [1]}  # merged key by key
    assert cfg.generate.for_task("index_lookup").test_samples == 100


@pytest.mark.parametrize("profile, override", [
    ("paper", "{generate: {datasets: {lis: [250]}}, sweep: {grid: {datasets: {lis: [250]}}}}"),  # its per_task stays
    ("cpu-repro",
     "sweep: {grid: {datasets: {dyck: [20]}}}"),  # its task_architectures and exclusions of index_lookup stay
    ("separations", "sweep: {grid: {architectures: [transformer]}}"),  # its arch_depths of the LSTM stay
])
def test_an_override_that_narrows_what_to_run_keeps_the_profiles_other_settings_valid(tmp_path, profile, override):
    tasks_line = "tasks: [" + ", ".join(tasks.TASKS) + "]\n"
    narrowed = yaml.safe_load(override)
    params = f"profile: {profile}\n{tasks_line}{yaml.safe_dump(narrowed)}"
    cfg = config.load_config(write_params(tmp_path / "params.yaml", params))
    dumped = cfg.model_dump()
    assert config.merge(dumped, narrowed) == dumped  # every key of the override holds its value


def test_an_override_of_lr_replaces_the_profiles_lrs_and_back(tmp_path):
    p = write_params(tmp_path / "params.yaml",
                     "profile: tiny\ntasks: [arithmetic, lis]\nsweep: {search: {lrs: [0.1, 0.01]}}\n")
    assert config.load_config(p).sweep.search.learning_rates() == [0.1, 0.01]
    p.write_text("profile: tiny\ntasks: [arithmetic, lis]\nsweep: {search: {lr: 0.05}}\n")
    assert config.load_config(p).sweep.search.learning_rates() == [0.05]


def test_a_validation_file_smaller_than_a_validation_scores_is_named_before_any_trial(tiny_cfg, tiny_data):
    """Data generated under another config, with fewer validation samples than sweep.evaluation.val_samples: the sweep
    names the file before it builds a model (a validation would otherwise score fewer samples than the profile says)."""
    from pipeline.data.datasets import DatasetError
    from pipeline.search.cells import build_cells

    cfg = tiny_cfg.model_copy(deep=True)
    cfg.sweep.evaluation.val_samples = 33
    with pytest.raises(DatasetError, match="arithmetic_2_val.parquet holds 32 validation samples, but "
                                           "sweep.evaluation.val_samples scores 33: regenerate it"):
        build_cells(cfg, tiny_data)


# every key of the sweep section before it was grouped (built from the section models, so that it cannot drift), and
# the old `search: grid|frontier`, now `search.strategy`
FLAT = sorted((key, f"sweep.{section}.{key}") for key, section in config.MOVED.items() if key != "strategy")


@pytest.mark.parametrize("where", ["profile", "params"])
@pytest.mark.parametrize("key, moved", [*FLAT, ("search", "sweep.search.strategy")])
def test_a_flat_sweep_key_is_an_error_that_says_where_it_moved(tmp_path, monkeypatch, key, moved, where):
    """A key given as profiles and params.yaml spelled it before the sections (`-S '++sweep.max_steps=100'` writes
    it into params.yaml) fails by name, with the section it lives in now, whatever its value."""
    tiny = config.load_config(profile="tiny").sweep
    value = "grid" if key == "search" else getattr(getattr(tiny, config.MOVED[key]), key)
    profile = yaml.safe_load((ROOT / "conf" / "tiny.yaml").read_text())
    params = {"profile": "flat", "tasks": ["arithmetic", "lis"]}
    (profile if where == "profile" else params).setdefault("sweep", {})[key] = value
    (tmp_path / "flat.yaml").write_text(yaml.safe_dump(profile))
    monkeypatch.setattr(config, "CONF_DIR", tmp_path)
    with pytest.raises(config.ConfigError, match=re.escape(f"sweep.{key}") + r"(: .*)? moved to " + re.escape(moved)):
        config.load_config(write_params(tmp_path / "params.yaml", yaml.safe_dump(params)))


@pytest.mark.parametrize("where", ["profile", "params"])
@pytest.mark.parametrize("old, key", sorted(config.MOVED_BETWEEN))
def test_a_key_that_moved_between_sections_is_an_error_that_says_where(tmp_path, monkeypatch, old, key, where):
    """The learning rates left `optim` for `search` and the architecture options `model` for `grid` (what a trial
    reads, apart from what the sweep alone reads): the old place, in a profile or params.yaml, fails by name."""
    profile = yaml.safe_load((ROOT / "conf" / "tiny.yaml").read_text())
    params = {"profile": "moved", "tasks": ["arithmetic", "lis"]}
    (profile if where == "profile" else params).setdefault("sweep", {}).setdefault(old, {})[key] = (
        {} if key.startswith("arch_") else 1e-3 if key == "lr" else [1e-3])
    (tmp_path / "moved.yaml").write_text(yaml.safe_dump(profile))
    monkeypatch.setattr(config, "CONF_DIR", tmp_path)
    to = config.MOVED_BETWEEN[old, key]
    with pytest.raises(config.ConfigError, match=re.escape(f"sweep.{old}.{key} moved to sweep.{to}.{key}")):
        config.load_config(write_params(tmp_path / "params.yaml", yaml.safe_dump(params)))


def test_an_override_of_one_key_of_a_section_keeps_the_profiles_other_keys_of_it(tmp_path):
    """`dvc exp run -S '++sweep.optim.max_steps=100'` writes `sweep: {optim: {max_steps: 100}}` into params.yaml: it
    changes that key alone; the profile's other keys of the section (and of its mappings) stay."""
    laptop = config.load_config(profile="laptop").sweep
    p = write_params(tmp_path / "params.yaml", "profile: laptop\ntasks: [lis, index_lookup]\n"
                     "sweep: {optim: {max_steps: 100}, search: {arch_lrs: {standard: [0.001]}}}\n")
    sweep = config.load_config(p).sweep
    assert sweep.optim.max_steps == 100 and sweep.search.arch_lrs == {"lstm": [0.01], "standard": [0.001]}
    assert sweep.optim.model_dump(exclude={"max_steps"}) == laptop.optim.model_dump(exclude={"max_steps"})
    assert sweep.search.model_dump(exclude={"arch_lrs"}) == laptop.search.model_dump(exclude={"arch_lrs"})
    assert sweep.search.lr == 3e-3 and sweep.optim.batch_size == 128  # the profile's, not the defaults


@pytest.mark.parametrize("override, message", [
    ("generate: {datasets: {index_lookup: [20, 30, 50, 100, 200, 400]}}",
     "decides: sep_index_lookup_one_layer is made at index_lookup sizes \\[20, 50, 100, 200, 400\\], the paper's; the "
     "grid runs \\[20, 30, 50, 100, 200, 400\\]: \\[30\\] not the paper's"),
    ("generate: {datasets: {index_lookup: [20, 50]}}", "\\[100, 200, 400\\] missing, so it cannot be decided whole"),
    ("sweep: {grid: {widths: [64, 128]}}",
     "decides: sep_index_lookup_one_layer's model is a 1-layer transformer of width 64; the grid runs it on "
     "index_lookup at widths \\[64, 128\\]"),
])
def test_a_profile_that_decides_a_claim_refuses_another_length_or_width_when_it_loads(tmp_path, override, message):
    p = write_params(tmp_path / "params.yaml", "profile: cpu-claims\ntasks: [index_lookup]\n" + override + "\n")
    with pytest.raises(config.ConfigError, match=message):
        config.load_config(p)


@pytest.mark.slow  # 8 s: the forecast measures every length, trials side by side
def test_a_profile_that_decides_a_claim_refuses_a_budget_the_forecast_says_will_not_fit_before_training(tmp_path):
    """The sweep stage measures the grid's rate here (a few steps) and refuses, naming both times, a budget whose
    every extension would not fit the hours the profile states; nothing is trained or written."""
    p = write_params(tmp_path / "params.yaml", "profile: cpu-claims\ntasks: [index_lookup]\n"
                     "decides: {claim: sep_index_lookup_one_layer, task: index_lookup, arch: transformer, depth: 1, "
                     "width: 64, hours: 0.01}\n")
    from pipeline.costs.prediction import check_decides

    with pytest.raises(config.ConfigError, match="decides.hours: 0.01 h for sep_index_lookup_one_layer, but the "
                                                 "forecast on this machine gives up to [0-9.]+ h"):
        check_decides(config.load_config(p))


def test_the_tiny_profile_runs_every_registered_architecture():
    """What the integration tests run (`tiny`): every architecture, so that a new one is in them from its first
    commit."""
    assert set(config.load_config(profile="tiny").sweep.grid.architectures) == set(models.ARCHITECTURES)


def test_the_mlflow_ui_a_browser_opens_comes_from_params_then_environment_then_the_tracking_uri(monkeypatch):
    """On KubeRay the tracking URI is in-cluster DNS: the links the sweep prints and the report shows use the public
    address where one is set."""
    monkeypatch.delenv("CAPACITY_ATLAS_MLFLOW_UI", raising=False)
    cluster = config.ClusterConfig(mlflow_tracking_uri="http://mlflow.atlas.svc:5000")
    assert cluster.mlflow_ui() == "http://mlflow.atlas.svc:5000"
    monkeypatch.setenv("CAPACITY_ATLAS_MLFLOW_UI", "https://mlflow.example.org")
    assert cluster.mlflow_ui() == "https://mlflow.example.org"
    assert config.ClusterConfig(mlflow_ui_url="http://127.0.0.1:8080").mlflow_ui() == "http://127.0.0.1:8080"
