"""The learned cost model: LightGBM corrections to a roofline prior, fitted on measured times.

Three kinds of measurement train it (cost/features.py defines the feature vectors):
- operator rows from `hetauto profile` (one device type per file): QKV/output projections, attention core, MLP
  GEMMs, norms, rotary, activation, logits GEMM, loss; a layer's time is the sum of its operators;
- whole layers from `hetauto profile --layers` of a profiled device: how its operators compose into a layer
  (stage 3, composition.py), kept where it carries over to a model left out;
- whole-layer rows: the per-layer GPU timings published by the Sailor project (sailor.py).

One module per concept:
- samples.py: a measured row (`Sample`), what is known of a device (`DeviceInfo`), the profile files;
- profile_merge.py: the grids a profile file holds (a second grid of a device is profiled into its file), and the
  fit's fix for two operator profiles of one device;
- sailor.py: the Sailor data and the training rows made of it (with its TP all-reduces set apart);
- sailor_host_floor.py: where Sailor's timings measure the host, not the GPU (a floor under a layer's time);
- sailor_links.py: Sailor's all-reduce curves inside a node, as a time and as an alpha-beta link, and the rates the
  fit set the measured layers' TP all-reduces apart at (the planner adds them back at those);
- sailor_updates.py: the optimizer step Sailor measured per profiled model;
- roofline_calibration.py: stage 1, the roofline prior calibrated per group of rows (rate x prior + overhead),
  and the robust fit of a rate and an overhead the later stages reuse;
- boosting.py: stage 2 fits LightGBM on log(measured / calibrated) per (granularity, phase) with cross-validated
  rounds;
- backward_weights.py: the two weights on a Sailor layer's backward prior, chosen by leaving one model out;
- composition.py: stage 3, how operators compose into a layer (the `hetauto profile --layers` files);
- optimizer_step.py: the optimizer step Sailor measured, fitted per device;
- fitting.py: `fit` runs the stages, measures a held-out share and saves the model;
- fitted.py: the fitted model in memory (`FittedModel`: calibration and composition tables, boosters) and
  `predict_samples`;
- manifest.py: the fitted model on disk (`manifest.json`: format, feature version, calibration and composition
  tables, device types covered, fit metrics; boosters in LightGBM's text format), written and read back checked;
- model.py: `LearnedCostModel`, which answers for the device types it has measurements of and hands every other
  device type to the analytic model; `source(device)` says which one answered, so a plan can state where each
  number came from;
- validation.py: predicted against measured.
"""
from .backward_weights import GEMM_BWD_WEIGHTS, SCORE_WEIGHTS, choose_weights  # noqa: F401
from .boosting import ROUND_CHOICES, choose_rounds, train_model, train_sailor_model  # noqa: F401
from .composition import fit_composition  # noqa: F401
from .fitting import FitResult, fit, split_holdout  # noqa: F401
from .fitted import FittedModel, calibrated_s, predict_samples  # noqa: F401
from .manifest import save_model  # noqa: F401
from .model import LearnedCostModel, load_cost_model  # noqa: F401
from .roofline_calibration import _fit_rate_overhead, fit_calibration  # noqa: F401
from .sailor import (SAILOR_DATA, SAILOR_FP32_TFLOPS, SAILOR_GPUS, SAILOR_MODELS, SailorLayer,  # noqa: F401
                     forward_tflops, leave_model_out, load_sailor, read_allreduce_fits, sailor_device_infos,
                     sailor_layer_samples, sailor_precisions, sailor_reading_samples, sailor_samples,
                     sailor_tp_allreduce_rates, with_tp_comm)
from .sailor_links import sailor_set_apart_rates  # noqa: F401
from .sailor_host_floor import HOST_BOUND_RATIO, host_bound_times, sailor_host_floors  # noqa: F401
from .samples import (H200_DATA, MODEL_FORMAT, PROFILE_FORMAT, DeviceInfo, MeasuredLayer, Sample,  # noqa: F401
                      calibration_key, host_floor_at, host_floor_key, mape, tp_allreduce_key, allreduce_rate_at, profile_granularity, profile_samples, read_layers,
                      read_profile)
from .validation import layer_time_pairs, summarise, validate, validate_layers  # noqa: F401
