"""A trial's resource use, sampled in its worker at every validation and reported with it (the driver logs it as the
child run's MLflow system metrics).

The names are MLflow's own system metrics (``mlflow.system_metrics``: the UI charts every ``system/`` metric of a
run in its System metrics tab), plus the trial's own process: a node runs several trials, and the machine's
figures are theirs together. Each figure covers the time since the previous sample (CPU) or is its state now
(memory); the GPU's is the peak of memory the trial's tensors held since the previous sample.
"""

from __future__ import annotations

import psutil
import torch

SYSTEM = "system/"  # MLflow's prefix of system metrics
MB = 1e6  # MLflow's system metrics are in decimal megabytes


class SystemSampler:
    def __init__(self, gpu: bool):
        self.gpu = gpu and torch.cuda.is_available()
        self.process = psutil.Process()
        psutil.cpu_percent(None)  # the first call of each starts the interval the next one measures
        self.process.cpu_percent(None)

    def sample(self) -> dict[str, float]:
        memory = psutil.virtual_memory()
        out = {
            "cpu_utilization_percentage": psutil.cpu_percent(None),
            "system_memory_usage_megabytes": memory.used / MB,
            "system_memory_usage_percentage": memory.percent,
            "process_cpu_utilization_percentage": self.process.cpu_percent(None),
            "process_memory_rss_megabytes": self.process.memory_info().rss / MB,
        }
        if self.gpu:
            device = torch.cuda.current_device()
            free, total = torch.cuda.mem_get_info(device)
            out |= {
                f"gpu_{device}_memory_usage_megabytes": (total - free) / MB,
                f"gpu_{device}_memory_usage_percentage": 100 * (total - free) / total,
                "process_gpu_peak_memory_megabytes": torch.cuda.max_memory_allocated(device) / MB,
            }
            torch.cuda.reset_peak_memory_stats(device)
        return {SYSTEM + k: v for k, v in out.items()}
