import pytest
import yaml

import models
import tasks
from pipeline.common import config
from pipeline.search.cells import check_architectures
from tests.helpers import ROOT, write_params


@pytest.mark.parametrize("profile", config.profiles())
def test_every_profile_validates_and_builds_every_model_of_its_grid(profile):
    cfg = config.load_config(profile=profile)
    assert cfg.profile == profile and cfg.sweep_datasets()
    for task, size in cfg.sweep_datasets():
        task_obj = tasks.get_task(task, size, **cfg.generate.task_params.get(task, {}))
        for arch in cfg.sweep.architectures_for(task):  # the smallest width, to keep it fast at paper sizes
            models.build_model(arch, vocab_size=task_obj.vocab_size, width=min(cfg.sweep.widths_for(arch)),
                               depth=min(cfg.sweep.depths_for(arch)), heads=cfg.sweep.heads, max_len=64,
                               **cfg.sweep.arch_options.get(arch, {}))


def test_params_yaml_gives_every_registered_task_a_generate_stage():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert sorted(params["tasks"]) == sorted(tasks.TASKS)
    assert params["profile"] in config.profiles()


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
    assert cfg.sweep.datasets == dp and cfg.generate.seed == 2023
    assert cfg.sweep.widths == [32, 64, 128, 256, 512, 1024] and cfg.sweep.depths == [3, 5]
    assert cfg.sweep.batch_size == 512 and cfg.sweep.epochs == 100 and cfg.sweep.gpus_per_trial == 1
    assert sorted(cfg.sweep.architectures) == ["linear", "sparse", "standard"]


def test_paper_faithful_is_paper_but_the_cells_no_figure_shows():
    """conf/paper-faithful.yaml is conf/paper.yaml key for key, but for the cells it leaves out."""
    faithful, paper = (yaml.safe_load((ROOT / "conf" / f"{p}.yaml").read_text()) for p in ("paper-faithful", "paper"))
    own = {k: faithful["sweep"].pop(k) for k in ("exclude", "task_architectures")}
    assert faithful == paper and own["task_architectures"] == {"ed_local": ["sparse", "linear"]}
    cfg = config.load_config(profile="paper-faithful")
    grid = set(cfg.sweep.grid(cfg.sweep_datasets()))
    assert len(grid) == 60 + 144 + 72 + 48  # arithmetic d3 to 512; ED d3 and d5; LIS d3; ED_Local sparse, linear d3
    assert {(t, d) for t, _, _, _, d in grid} == {("arithmetic", 3), ("ed", 3), ("ed", 5), ("lis", 3), ("ed_local", 3)}
    assert max(w for t, _, _, w, _ in grid if t == "arithmetic") == 512
    assert all(tasks.TASKS[t].paper_sizes == tuple(cfg.sweep.datasets[t]) for t in cfg.sweep.datasets)


def test_a_grid_leaves_out_the_cells_exclude_matches_and_a_misspelt_name_is_named(tmp_path):
    base = "profile: tiny\ntasks: [arithmetic, lis]\n"
    excluded = base + "sweep: {exclude: [{depths: [1], tasks: [lis]}]}"
    cfg = config.load_config(write_params(tmp_path / "p.yaml", excluded))
    every = config.load_config(profile="tiny")
    kept, whole = cfg.sweep.grid(cfg.sweep_datasets()), every.sweep.grid(every.sweep_datasets())
    assert set(kept) == {c for c in whole if not (c[0] == "lis" and c[4] == 1)} and len(kept) < len(whole)
    with pytest.raises(config.ConfigError, match=r"sweep.exclude\[0\].tasks: 'lsi' is not allowed"):
        config.load_config(write_params(tmp_path / "q.yaml", base + "sweep: {exclude: [{tasks: [lsi]}]}"))
    typo = config.load_config(write_params(tmp_path / "t.yaml", base + "sweep: {exclude: [{architectures: [lstn]}]}"))
    with pytest.raises(config.ConfigError, match=r"sweep.exclude\[0\].architectures: 'lstn' is not allowed"):
        check_architectures(typo)  # the sweep stage's check, before any compute
    with pytest.raises(config.ConfigError, match="sweep.exclude.0.task: Extra inputs are not permitted"):
        config.load_config(write_params(tmp_path / "r.yaml", base + "sweep: {exclude: [{task: [lis]}]}"))
    with pytest.raises(config.ConfigError, match="sweep.exclude leaves no cell of the grid"):
        config.load_config(write_params(tmp_path / "s.yaml", base + "sweep: {exclude: [{tasks: [lis, arithmetic]}]}"))


def test_separations_profile_declares_the_separations_papers_grid():
    cfg = config.load_config(profile="separations")
    lengths = [20, 50, 100, 200, 400]
    assert cfg.generate.datasets == {"index_lookup": lengths, "dyck": lengths, "eq_random": lengths,
                                     "eq_one": lengths, "eq_ncp": lengths + [800]}
    assert cfg.generate.train_samples == 1_000_000 and cfg.generate.test_samples == 5_000
    assert not cfg.generate.unique  # i.i.d., like the paper's online sampling
    assert cfg.sweep.widths == [64, 128, 256, 512] and cfg.sweep.depths == [1, 2, 4, 6] and cfg.sweep.batch_size == 64


def test_params_overrides_win_over_the_profile(tmp_path):
    p = write_params(tmp_path / "params.yaml", "profile: tiny\ntasks: [arithmetic, lis]\nsweep: {seeds: [0, 1, 2]}\n")
    cfg = config.load_config(p)
    assert cfg.sweep.seeds == [0, 1, 2] and cfg.sweep.widths == config.load_config(profile="tiny").sweep.widths


@pytest.mark.parametrize("override, message", [
    ("profile: nope",
     "profile: 'nope' is not allowed; allowed values: cpu-repro, laptop, paper, paper-faithful, separations, tiny"),
    ("sweep: {architectures: [standard, transformerx]}",
     "sweep.architectures: 'transformerx' is not allowed; allowed values: " + ", ".join(sorted(models.ARCHITECTURES))),
    ("sweep: {widths: [16, 15]}", "sweep.widths: 15 is not divisible by sweep.heads = 2"),
    ("sweep: {widths: []}", "sweep.widths is empty"),
    ("sweep: {depths: [0]}", "sweep.depths.0: Input should be greater than 0"),
    ("generate: {datasets: {lis: [-4]}}", "generate.datasets.lis.0: Input should be greater than 0"),
    ("generate: {datasets: {sorting: [4]}}",
     "generate.datasets: 'sorting' is not allowed; allowed values: arithmetic, lis"),
    ("generate: {datasets: {lis: [2]}}", "generate.datasets.lis: lis size n must be >= 3"),
    ("generate: {task_params: {lis: {value_range: 5}}}", "value_range must be >= 2n \\+ 1"),
    ("generate: {per_task: {dyck: {unique: false}}}", "generate.per_task: 'dyck' is not allowed; allowed values: "
     "arithmetic, lis"),
    ("sweep: {arch_depths: {rnn: [1, 2]}}", "sweep.arch_depths: 'rnn' is not allowed; allowed values: "
     + ", ".join(sorted(models.ARCHITECTURES))),
    ("sweep: {arch_depths: {lstm: []}}", "sweep.arch_depths.lstm is empty"),
    ("sweep: {datasets: {lis: [99]}}", "sweep.datasets.lis: 99 is not allowed"),
    ("sweep: {learning_rate: 0.1}", "sweep.learning_rate: Extra inputs are not permitted"),
    ("sweep: {arch_options: {sparse: {window: 3}}}", "sweep.arch_options.sparse: unknown option"),
    ("tasks: [arithmetic, lis, sorting]", "tasks: 'sorting' is not allowed"),
    ("sweep: {lr: .inf}", "sweep.lr: Input should be a finite number"),
    ("sweep: {max_steps: 0}", "sweep.max_steps: 0 trains nothing"),
    ("sweep: {grad_clip: -1}", "sweep.grad_clip: Input should be greater than 0"),
    ("sweep: {lrs: []}", "sweep.lrs is empty"),
    ("sweep: {lrs: [0.01, 0.01]}", "sweep.lrs: \\[0.01, 0.01\\] must be positive and distinct"),
    ("sweep: {lr: 0.01, lrs: [0.1]}", "sweep.lr and sweep.lrs are both set"),
    ("sweep: {patience: 0}", "sweep.patience: Input should be greater than 0"),
    ("sweep: {max_budget_factor: 0}", "sweep.max_budget_factor: Input should be greater than or equal to 1"),
    ("sweep: {max_budget_factor: 1.5}", "sweep.max_budget_factor: Input should be a valid integer"),
    ("sweep: {convergence_window: 1}", "sweep.convergence_window: Input should be less than 1"),
    ("sweep: {convergence_window: 0}", "sweep.convergence_window: Input should be greater than 0"),
    ("sweep: {convergence_tolerance: -0.1}", "sweep.convergence_tolerance: Input should be greater than 0"),
    ("sweep: {convergence_min_steps: 0}", "sweep.convergence_min_steps: Input should be greater than 0"),
    ("sweep: {plateau_checks: 5}", "sweep.plateau_checks"),
    ("sweep: {cpus_per_trial: 100000}", "sweep.cpus_per_trial: Input should be less than or equal to 1024"),
    ("generate: {chunk_size: 100000000}", "generate.chunk_size: Input should be less than or equal to 1048576"),
    ("sweep: {search: frontier, widths: [16]}", "sweep.widths: \\[16\\] is a single width; sweep.search: frontier"),
    ("sweep: {widths: [16, 8]}", "sweep.widths: \\[16, 8\\] must be strictly increasing"),
    ("sweep: {widths: [8, 8, 16]}", "sweep.widths: \\[8, 8, 16\\] must be strictly increasing"),
    ("sweep: {arch_widths: {lstm: [32, 16]}}", "sweep.arch_widths.lstm: \\[32, 16\\] must be strictly increasing"),
    ("sweep: {arch_lrs: {lstm: []}}", "sweep.arch_lrs.lstm is empty"),
    ("sweep: {task_architectures: {dyck: [lstm]}}", "sweep.task_architectures: 'dyck' is not allowed; allowed "
                                                    "values: arithmetic, lis"),
    ("sweep: {task_architectures: {lis: [rnn]}}", "sweep.task_architectures.lis: 'rnn' is not allowed; allowed "
                                                  "values: dss, linear,"),
    ("sweep: {task_architectures: {lis: []}}", "sweep.task_architectures.lis is empty"),
    ("sweep: {search: bisect}", "sweep.search: Input should be 'grid' or 'frontier'"),
    ("sweep: {gpus_per_trial: 1.5}", "sweep.gpus_per_trial: 1.5 -- above 1 it counts whole GPUs"),
    ("sweep: {gpus_per_trial: 2, workers_per_trial: 3}", "each data-parallel worker takes one GPU, so "
                                                         "workers_per_trial is 2"),
    ("sweep: {gpus_per_trial: 0.5, workers_per_trial: 2}", "data-parallel workers need a GPU each"),
    ("sweep: {workers_per_trial: 3}", "sweep.batch_size: 32 does not split evenly over 3"),
    ("sweep: {max_failures: -1}", "sweep.max_failures: Input should be greater than or equal to 0"),
    ("report: {accuracy_threshold: 1.0}", "report.accuracy_threshold: Input should be less than 1"),
    ("report: {accuracy_threshold: 0}", "report.accuracy_threshold: Input should be greater than 0"),
    # a section that is not a mapping
    ("sweep: 5", "params.yaml: sweep: 5 is not allowed; allowed: a mapping of sweep keys \\(or null\\)"),
    ("cluster: [x]", "params.yaml: cluster: \\['x'\\] is not allowed; allowed: a mapping of cluster keys"),
    # architecture options, by the types and ranges each architecture declares
    ("sweep: {arch_options: {sparse: {block: 0}}}", "sweep.arch_options.sparse.block: 0 is not allowed for 'sparse'; "
                                                    "allowed: int >= 1, or null \\(B from the sequence length\\)"),
    ("sweep: {arch_options: {sparse: {block: true}}}", "sweep.arch_options.sparse.block: True is not allowed"),
    ("sweep: {arch_options: {sparse: {k: null}}}", "sweep.arch_options.sparse.k: None is not allowed for 'sparse'; "
                                                   "allowed: int >= 1$"),
    ("sweep: {arch_options: {linear: {chunk: -1}}}", "sweep.arch_options.linear.chunk: -1 is not allowed for "
                                                     "'linear'; allowed: int >= 1"),
    ("sweep: {arch_options: {sliding_window: {window: x}}}", "sweep.arch_options.sliding_window.window: 'x' is not "
                                                             "allowed for 'sliding_window'; allowed: int >= 1"),
    ("sweep: {arch_options: {mamba: {conv: 1}}}", "sweep.arch_options.mamba.conv: 1 is not allowed for 'mamba'; "
                                                  "allowed: int >= 2"),
    ("sweep: {arch_options: {sinks: {sinks: 2.5}}}", "sweep.arch_options.sinks.sinks: 2.5 is not allowed for "
                                                     "'sinks'; allowed: int >= 0"),
    # memory: micro-batches of at least one sample, a positive budget
    ("sweep: {batch_size: 8, micro_batches: 9}",
     "sweep.micro_batches: 9 is more than the 8 samples of a worker's batch"),
    ("sweep: {memory_gb_per_trial: 0}", "sweep.memory_gb_per_trial: Input should be greater than 0"),
    # no lax coercion: a bool is not an int, a string not a number, an int not a bool
    ("sweep: {heads: true}", "sweep.heads: Input should be a valid integer \\(got True\\)"),
    ("sweep: {eval_batch_size: true}", "sweep.eval_batch_size: Input should be a valid integer \\(got True\\)"),
    ("sweep: {epochs: '5'}", "sweep.epochs: Input should be a valid integer \\(got '5'\\)"),
    ("sweep: {dropout: false}", "sweep.dropout: Input should be a valid number \\(got False\\)"),
    ("generate: {unique: 1}", "generate.unique: Input should be a valid boolean \\(got 1\\)"),
    ("nightly: {throughput_drop: true}", "nightly.throughput_drop: Input should be a valid number \\(got True\\)"),
    # no infinities or NaNs: they pass a bound such as ge=0 and break the arithmetic after it
    ("sweep: {weight_decay: .inf}", "sweep.weight_decay: Input should be a finite number \\(got inf\\)"),
    ("sweep: {gpus_per_trial: .inf}", "sweep.gpus_per_trial: Input should be a finite number \\(got inf\\)"),
    ("nightly: {accuracy_drop: .nan}", "nightly.accuracy_drop: Input should be a finite number \\(got nan\\)"),
    ("report: {accuracy_threshold: .nan}", "report.accuracy_threshold: Input should be a finite number"),
    # no empty names
    ("sweep: {experiment: ''}", "sweep.experiment: Input should be a non-blank string \\(got ''\\)"),
    ("nightly: {history: ' '}", "nightly.history: Input should be a non-blank string \\(got ' '\\)"),
    ("cluster: {storage_path: ''}", "cluster.storage_path: Input should be a non-blank string \\(got ''\\)"),
    ("cluster: {mlflow_tracking_uri: ''}", "cluster.mlflow_tracking_uri: Input should be a non-blank string"),
    ("cluster: {ray_address: '  '}", "cluster.ray_address: Input should be a non-blank string \\(got '  '\\)"),
    # seeds and workers
    ("generate: {seed: -1}", "generate.seed: Input should be greater than or equal to 0 \\(got -1\\)"),
    ("sweep: {seeds: [0, -1]}", "sweep.seeds.1: Input should be greater than or equal to 0 \\(got -1\\)"),
    ("sweep: {seeds: [4294967296]}", "sweep.seeds.0: Input should be less than or equal to 4294967295"),
    ("generate: {workers: 1000}", "generate.workers: 1000 is more than 64 processes; allowed: 1 to 64 \\(the files "
                                  "are byte-identical for any number"),
    ("generate: {workers: 0}", "generate.workers: Input should be greater than 0 \\(got 0\\)"),
    # repeats, and validation that would never run
    ("sweep: {seeds: [0, 0]}", "sweep.seeds: \\[0, 0\\] has repeats; allowed: distinct values"),
    ("sweep: {depths: [1, 1]}", "sweep.depths: \\[1, 1\\] has repeats"),
    ("sweep: {arch_depths: {lstm: [2, 2]}}", "sweep.arch_depths.lstm: \\[2, 2\\] has repeats"),
    ("sweep: {architectures: [lstm, lstm]}", "sweep.architectures: \\['lstm', 'lstm'\\] has repeats"),
    ("generate: {datasets: {lis: [3, 3]}}", "generate.datasets.lis: \\[3, 3\\] has repeats"),
    ("tasks: [arithmetic, lis, lis]", "tasks: \\['arithmetic', 'lis', 'lis'\\] has repeats"),
    ("sweep: {eval_batch_size: 0}", "sweep.eval_batch_size: Input should be greater than 0 \\(got 0\\)"),
    ("sweep: {val_every_steps: 0}", "sweep.val_every_steps: Input should be greater than 0 \\(got 0\\)"),
    ("sweep: {val_every_steps: 9}", "sweep.val_every_steps: 9 is more than sweep.max_steps = 8: a trial would never "
                                    "validate"),
    # a validation split smaller than a validation scores, or larger than the test distribution holds
    ("sweep: {val_samples: 64}", "sweep.val_samples: 64 is more than the 32 validation samples generate.val_samples "
                                 "makes for arithmetic"),
    ("generate: {per_task: {lis: {val_samples: 16}}}", "sweep.val_samples: 32 is more than the 16 validation samples "
                                                       "generate.val_samples makes for lis"),
    ("generate: {val_samples: 0}", "generate.val_samples: Input should be greater than 0"),
    ("generate: {val_samples: 100000}", "generate.datasets.arithmetic: arithmetic size 2: 100040 distinct test \\+ "
                                        "val samples asked, but the space"),
    ("nightly: {accuracy_drop: 1.5}", "nightly.accuracy_drop: Input should be less than or equal to 1"),
    # successive halving and predictions
    ("sweep: {lr_search: halving, halving_rungs: [4], halving_keep: 1.0}",
     "sweep.halving_keep: Input should be less than 1 \\(got 1.0\\)"),
    ("sweep: {lr_search: halving, halving_rungs: [4], halving_keep: 0}",
     "sweep.halving_keep: Input should be greater than 0"),
    ("sweep: {lr_search: halving, halving_rungs: [4, 4]}", "sweep.halving_rungs: \\[4, 4\\] must increase"),
    ("sweep: {lr_search: halving}", "sweep.halving_rungs is empty: lr_search: halving needs the steps"),
    ("sweep: {lr_search: halving, halving_rungs: [6]}", "must be multiples of sweep.val_every_steps = 4"),
    ("sweep: {lr_search: halving, halving_rungs: [8]}", "must end below the first step budget sweep.max_steps = 8"),
    ("sweep: {lr_search: quartering}", "sweep.lr_search: Input should be 'all' or 'halving'"),
    ("sweep: {lr_search: halving, halving_rungs: [4], halving_unguided: drop}",
     "sweep.halving_unguided: Input should be 'keep' or 'rank'"),
    ("sweep: {search: frontier, predict: [sizes, tea_leaves]}", "sweep.predict.1: Input should be 'sizes', 'seeds' "
                                                                "or 'neighbours' \\(got 'tea_leaves'\\)"),
    ("sweep: {search: grid, predict: [sizes]}", "sweep.predict: \\['sizes'\\] needs sweep.search: frontier"),
    ("sweep: {fuse: seeds}", "sweep.fuse: Input should be 'off' or 'learning_rates'"),
    ("sweep: {fuse: learning_rates, workers_per_trial: 2}",
     "sweep.fuse: learning_rates trains a cell's learning rates in one process; with 2 data-parallel workers"),
    ("sweep: {fuse: learning_rates, gpus_per_trial: 1, precision: 16-mixed}",
     "sweep.fuse: learning_rates with sweep.precision: 16-mixed: the gradient scaler skips a step for every member"),
])
def test_bad_params_are_rejected_with_the_key_and_allowed_values(tmp_path, override, message):
    base = {"profile": "tiny", "tasks": ["arithmetic", "lis"]}
    base.update(yaml.safe_load(override))
    p = write_params(tmp_path / "params.yaml", yaml.safe_dump(base))
    with pytest.raises(config.ConfigError, match=message):
        check_architectures(config.load_config(p))  # as the sweep stage checks it


@pytest.mark.parametrize("text, line", [
    ("profile: tiny\ntasks: [arithmetic, lis]\nsweep: {seeds: [0, 1}\n", "line 3, column 21: expected ',' or ']'"),
    ("profile: tiny\ntasks: [arithmetic, lis]\nsweep:\n  seeds: [0]\n   widths: [8]\n", "line 5, column 4"),
    ("profile: tiny\n\ttasks: [arithmetic, lis]\n", "line 2, column 1: found character '\\\\t'"),
])
def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path, text, line):
    p = write_params(tmp_path / "params.yaml", text)
    with pytest.raises(config.ConfigError, match=f"params.yaml: not valid YAML at {line}"):
        config.load_config(p)


@pytest.mark.parametrize("text, message", [
    ("sweep: {widths: [8, 16}\n", "broken.yaml: not valid YAML at line 1, column 23"),
    ("sweep: 5\n", "broken.yaml: sweep: 5 is not allowed; allowed: a mapping of sweep keys"),
])
def test_a_broken_profile_names_its_file(tmp_path, monkeypatch, text, message):
    (tmp_path / "broken.yaml").write_text(text)
    monkeypatch.setattr(config, "CONF_DIR", tmp_path)
    p = write_params(tmp_path / "params.yaml", "profile: broken\ntasks: [arithmetic, lis]\n")
    with pytest.raises(config.ConfigError, match=message):
        config.load_config(p)


def test_yaml_ints_still_validate_where_numbers_are_expected(tmp_path):
    p = write_params(tmp_path / "params.yaml", "profile: tiny\ntasks: [arithmetic, lis]\nsweep: {dropout: 0, "
                     "gpus_per_trial: 0, weight_decay: 1, lr: 1, seeds: [0, 4294967295]}\nnightly: {accuracy_drop: 1}\n"
                     "generate: {seed: 0, workers: 64}\n")
    cfg = config.load_config(p)
    assert (cfg.sweep.dropout, cfg.sweep.lr, cfg.nightly.accuracy_drop, cfg.generate.workers) == (0.0, 1.0, 1.0, 64)


@pytest.mark.parametrize("resources, trial", [
    ({}, {"cpu": 1, "gpu": 0}),
    ({"gpus_per_trial": 0.25}, {"cpu": 1, "gpu": 0.25}),  # four small trials share a GPU
    ({"gpus_per_trial": 2, "cpus_per_trial": 3}, {"cpu": 6, "gpu": 2}),  # two data-parallel workers, a GPU each
    ({"workers_per_trial": 2}, {"cpu": 2, "gpu": 0}),  # the CPU twin: DDP over gloo
])
def test_a_trial_takes_every_workers_cpus_and_gpus_from_one_node(resources, trial):
    sweep = config.load_config(profile="tiny").sweep.model_copy(update=resources)
    assert sweep.trial_resources() == trial


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
                     "dyck, eq_random, eq_one, eq_ncp]\nsweep: {depths: [1, 2], arch_depths: {lstm: [3]}}\n")
    cfg = config.load_config(p)
    cells = build_cells(cfg, tiny_data)
    assert {c.depth for c in cells if c.arch == "lstm"} == {3}
    assert {c.depth for c in cells if c.arch == "standard"} == {1, 2}
    per_depth = len(cfg.sweep.widths) * len(cfg.sweep_datasets()) * len(cfg.sweep.seeds)
    assert len(cells) == per_depth * (2 * (len(cfg.sweep.architectures) - 1) + 1)


def test_an_architecture_may_have_its_own_widths_and_learning_rates(tmp_path, tiny_data):
    """A 1-layer transformer at 64 beside an LSTM at 64..256, in one sweep, without the transformer at 256."""
    from pipeline.search.cells import build_cells

    p = write_params(tmp_path / "params.yaml", "profile: tiny\ntasks: [arithmetic, lis]\nsweep: {architectures: "
                     "[transformer, lstm], widths: [64], depths: [1], lrs: [0.001, 0.0003], "
                     "arch_widths: {lstm: [64, 128, 256]}, arch_lrs: {lstm: [0.01]}}\n")
    cells = build_cells(config.load_config(p), tiny_data)
    assert {c.width for c in cells if c.arch == "transformer"} == {64}
    assert {c.width for c in cells if c.arch == "lstm"} == {64, 128, 256}
    assert {v.lrs for c, v in cells.items() if c.arch == "lstm"} == {(0.01,)}
    assert {v.lrs for c, v in cells.items() if c.arch == "transformer"} == {(0.001, 0.0003)}


def test_each_task_may_train_its_own_architectures(tmp_path, tiny_data):
    """Each paper's models on its own tasks, in one sweep: the others train on every task."""
    from pipeline.search.cells import build_cells

    p = write_params(tmp_path / "params.yaml", "profile: tiny\ntasks: [arithmetic, lis]\nsweep: {architectures: "
                     "[standard, sparse, lstm], task_architectures: {lis: [lstm]}}\n")
    cells = build_cells(config.load_config(p), tiny_data)
    assert {c.arch for c in cells if c.task == "lis"} == {"lstm"}
    assert {c.arch for c in cells if c.task == "arithmetic"} == {"standard", "sparse", "lstm"}


def test_datasets_overrides_replace_the_profiles_and_other_mappings_merge(tmp_path):
    p = write_params(tmp_path / "params.yaml", "profile: separations\ntasks: [index_lookup, dyck, eq_random, eq_one, "
                     "eq_ncp]\ngenerate: {datasets: {index_lookup: [20, 50]}, "
                     "per_task: {index_lookup: {test_samples: 100}}}\n"
                     "sweep: {arch_depths: {transformer: [1]}}\n")
    cfg = config.load_config(p)
    assert cfg.generate.datasets == {"index_lookup": [20, 50]}  # replaced: the profile's 23 datasets are gone
    assert cfg.sweep.arch_depths == {"lstm": [1, 2, 3], "transformer": [1]}  # merged key by key
    assert cfg.generate.for_task("index_lookup").test_samples == 100


@pytest.mark.parametrize("profile, override", [
    ("paper", "{generate: {datasets: {lis: [250]}}, sweep: {datasets: {lis: [250]}}}"),  # its per_task stays
    ("cpu-repro", "sweep: {datasets: {dyck: [20]}}"),  # its task_architectures and exclusions of index_lookup stay
    ("separations", "sweep: {architectures: [transformer]}"),  # its arch_depths of the LSTM stay
])
def test_an_override_that_narrows_what_to_run_keeps_the_profiles_other_settings_valid(tmp_path, profile, override):
    tasks_line = "tasks: [" + ", ".join(tasks.TASKS) + "]\n"
    narrowed = yaml.safe_load(override)
    params = f"profile: {profile}\n{tasks_line}{yaml.safe_dump(narrowed)}"
    cfg = config.load_config(write_params(tmp_path / "params.yaml", params))
    assert {k: getattr(getattr(cfg, section), k) for section, keys in narrowed.items() for k in keys} \
        == {k: v for keys in narrowed.values() for k, v in keys.items()}


def test_an_override_of_lr_replaces_the_profiles_lrs_and_back(tmp_path):
    p = write_params(tmp_path / "params.yaml", "profile: tiny\ntasks: [arithmetic, lis]\nsweep: {lrs: [0.1, 0.01]}\n")
    assert config.load_config(p).sweep.learning_rates() == [0.1, 0.01]
    p.write_text("profile: tiny\ntasks: [arithmetic, lis]\nsweep: {lr: 0.05}\n")
    assert config.load_config(p).sweep.learning_rates() == [0.05]


def test_a_validation_file_smaller_than_a_validation_scores_is_named_before_any_trial(tiny_cfg, tiny_data):
    """Data generated under another config, with fewer validation samples than sweep.val_samples: the sweep names
    the file before it builds a model (a validation would otherwise score fewer samples than the profile says)."""
    from pipeline.data.datasets import DatasetError
    from pipeline.search.cells import build_cells

    cfg = tiny_cfg.model_copy(deep=True)
    cfg.sweep.val_samples = 33
    with pytest.raises(DatasetError, match="arithmetic_2_val.parquet holds 32 validation samples, but "
                                           "sweep.val_samples scores 33: regenerate it"):
        build_cells(cfg, tiny_data)
