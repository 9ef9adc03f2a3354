"""dprobe's vocabulary, each name defined once: what is forecast, at which quantiles, the jobs' precisions
and optimizers, and the Prometheus metrics the services export and read.

Imports nothing: the services install (no torch) and every part of dprobe read it.
"""

from __future__ import annotations

# forecasts -------------------------------------------------------------------------------------------
QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)
# what the sidecar samples, forecasts and exports per target (a forecaster's tasks name further metrics:
# gpu_duty_cycle_pct, gpu_demand)
SIDECAR_METRICS = ("gpu_memory_bytes", "gpu_utilization_ratio")

# the simple forecasters every model is scored beside (dprobe.forecaster.baselines makes them)
BASELINES: tuple[str, ...] = ("last_value", "seasonal_naive", "moving_average", "moving_median", "ewma", "ets")

# training jobs (cold-start profiles) -----------------------------------------------------------------
# fp32; bf16 or fp16 autocast, weights in fp32; bf16-pure: the model in bf16 with bf16 autocast
PRECISIONS = ("fp32", "bf16", "fp16", "bf16-pure")
OPTIMIZERS = ("adamw", "adam", "sgd")

# Prometheus metrics (prefix dprobe_, base units, ratios 0-1) -----------------------------------------
# the sidecar's, per target: by SIDECAR_METRICS
PREDICTED = {"gpu_memory_bytes": "dprobe_predicted_gpu_memory_bytes",
             "gpu_utilization_ratio": "dprobe_predicted_gpu_utilization_ratio"}
# the latest readings: by SIDECAR_METRICS, then by the key of a further reading in a sample's ``extra``
OBSERVED = {"gpu_memory_bytes": "dprobe_observed_gpu_memory_bytes",
            "gpu_utilization_ratio": "dprobe_observed_gpu_utilization_ratio",
            "memory_total_bytes": "dprobe_observed_gpu_memory_total_bytes",
            "power_watts": "dprobe_observed_gpu_power_watts",
            "sm_clock_hertz": "dprobe_observed_gpu_sm_clock_hertz"}
LAST_SAMPLE_AGE = "dprobe_last_sample_age_seconds"
# a target's training job, predicted before it runs: by the stem of the job profile's value
JOB_PREDICTED = {"gpu_memory_bytes": "dprobe_job_predicted_gpu_memory_bytes",
                 "allocator_peak_bytes": "dprobe_job_predicted_allocator_peak_bytes",
                 "gpu_utilization_ratio": "dprobe_job_predicted_gpu_utilization_ratio",
                 "step_seconds": "dprobe_job_predicted_step_seconds"}
JOB_INFO = "dprobe_job"  # an info metric: dprobe_job_info
FORECAST_SECONDS = "dprobe_forecast_seconds"
SOURCE_ERRORS = "dprobe_source_errors"  # a counter: dprobe_source_errors_total
MODEL_INFO = "dprobe_model"  # an info metric: dprobe_model_info
# the scaler's
RECOMMENDED_REPLICAS = "dprobe_recommended_replicas"
RECOMMENDED_GPUS = "dprobe_recommended_gpus"
# the scaler's, with sharing enabled (also dprobe_recommended_gpus{vc,sharing="none"|"shared"})
RECOMMENDED_GPU_MEMORY = "dprobe_recommended_gpu_memory_bytes"
RECOMMENDED_GPU_FRACTION = "dprobe_recommended_gpu_fraction"
RECOMMENDED_MIG_PROFILE = "dprobe_recommended_mig_profile"  # an info metric: dprobe_recommended_mig_profile_info
COLOCATION_PLAN = "dprobe_colocation_plan_pods"  # pods of a workload on one GPU of the plan
