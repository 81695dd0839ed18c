"""Reproduction grids as data: `Reproduction` records, registered by name.

The built-in grids reproduce the seed papers' comparisons (`binaries/reproduce.py
--experiment=NAME`). A plugin adds its own, to sweep its own algorithm, with
`registry.register_reproduction(name, experiment)` or an entry point in the group
`tff_comp.experiments` naming a function that returns an `Reproduction`:

    [options.entry_points]
    tff_comp.experiments =
        my_sweep = my_package.sweeps:my_sweep
"""

import dataclasses
import itertools

from tff_comp import registry

LEARNING_RATES = ('client_learning_rate', 'server_learning_rate')
# How tables name the grid's axes (others by their own names).
SHORT_NAMES = {'client_learning_rate': 'eta_c', 'server_learning_rate': 'eta_s'}


@dataclasses.dataclass(frozen=True)
class Reproduction:
  """A grid comparison: every algorithm over its grid (`axes`), each configuration
  trained with every seed; `metric` is reported (`higher_is_better` orients it),
  `select_on` picks each algorithm's configuration; `plot_metrics` are drawn side by
  side (default: `metric`)."""

  task: str
  algorithms: tuple[str, ...]
  client_learning_rates: tuple[float, ...]
  server_learning_rates: tuple[float, ...]
  rounds: int
  checkpoints: tuple[int, ...]
  metric: str
  higher_is_better: bool = True
  task_options: dict = dataclasses.field(default_factory=dict)
  algorithm_options: dict = dataclasses.field(default_factory=dict)  # name -> options
  settings: dict = dataclasses.field(default_factory=dict)  # ExperimentConfig fields
  # label -> ExperimentConfig fields of that algorithm's runs only (e.g. batch_size)
  algorithm_settings: dict = dataclasses.field(default_factory=dict)
  plot_metrics: tuple[str, ...] = ()
  eval_period: int = 10
  seeds: tuple[int, ...] = ()  # default: the --seed flag
  aliases: dict = dataclasses.field(default_factory=dict)  # label -> registered name
  # label -> {metric: the evaluation metric to read instead} (Ditto's personal models)
  metric_sources: dict = dataclasses.field(default_factory=dict)
  # label -> {hyperparameter: values}: the algorithm's own axes of the grid besides the
  # shared learning rates (an axis named client_learning_rate or server_learning_rate
  # replaces the shared one). A name among the client work's hparams is set through
  # them (one build serves the grid); any other is an algorithm option (a build each).
  tuning: dict = dataclasses.field(default_factory=dict)
  # What configurations are selected on (default: `metric`): its counterpart on the
  # task's validation data, where the task has some, so no reported number picks its own
  # configuration; `select_higher_is_better` orients it (default: as `metric`).
  select_on: str = ''
  select_higher_is_better: bool | None = None
  # Curves also drawn against this column of metrics.csv (e.g. 'time/simulated_seconds';
  # '': rounds only), and with `target`, a column of the time each algorithm's `metric`
  # first reached it (better or equal).
  x_axis: str = ''
  target: float | None = None
  # The peak resident memory of one of the grid's processes, in GB, as measured (0: the
  # default of `grid_processes.PROCESS_GB`); `reproduce.py` runs no more processes by
  # default than the available memory holds at this much each.
  process_gb: float = 0.0


def selection(spec: Reproduction) -> tuple[str, bool]:
  """(metric configurations are selected on, whether higher is better)."""
  higher = spec.select_higher_is_better
  return spec.select_on or spec.metric, spec.higher_is_better if higher is None else higher


def axes(spec: Reproduction, algorithm: str) -> dict[str, tuple[float, ...]]:
  """The grid axes of `algorithm` (a label of `spec`): the two learning rates first."""
  own = spec.tuning.get(algorithm, {})
  return {
    'client_learning_rate': tuple(own.get('client_learning_rate', spec.client_learning_rates)),
    'server_learning_rate': tuple(own.get('server_learning_rate', spec.server_learning_rates)),
    **{k: tuple(v) for k, v in own.items() if k not in LEARNING_RATES},
  }


def configurations(spec: Reproduction, algorithm: str) -> list[tuple[float, ...]]:
  """Every configuration of `algorithm`'s grid, values in `axes` order: (eta_c, eta_s,
  then its own hyperparameters)."""
  return list(itertools.product(*axes(spec, algorithm).values()))


def describe(spec: Reproduction, algorithm: str, config: tuple[float, ...]) -> str:
  """A configuration as 'eta_c=0.01, eta_s=1, q=0.2'."""
  return ', '.join(
    f'{SHORT_NAMES.get(name, name)}={value:g}' for name, value in zip(axes(spec, algorithm), config)
  )


# Every built-in comparison gives each algorithm a grid of the same size over its own
# hyperparameters (`tuning`), selects on validation data where the task has some (the
# optimization papers on the objective they minimize) and runs 3 seeds.
SEEDS = (0, 1, 2)
FCO_ALGORITHMS = ('fedmid', 'fedmid_osp', 'feddualavg', 'feddualavg_osp')
# Local-SCGDM's client rate eta only scales a, beta and gamma (its steps are a eta,
# beta eta and gamma eta), so its grids fix eta = 1 and search those three directly.
_SCGDM_RATE = dict(client_learning_rate=(1.0,))
_BUILT_IN = {
  # Yuan, Zaheer, Reddi (ICML 2021), Fig. 3: federated LASSO, dataset I. The methods
  # share their hyperparameters (eta_c, eta_s): 16 configurations each.
  'fco_lasso': Reproduction(
    task='lasso',
    algorithms=FCO_ALGORITHMS,
    client_learning_rates=(1e-4, 3e-4, 1e-3, 3e-3),
    server_learning_rates=(1.0, 3.0, 10.0, 30.0),
    rounds=500,
    checkpoints=(50, 100, 200, 500),
    metric='f1',
    select_on='train_objective',
    select_higher_is_better=False,
    plot_metrics=('f1', 'train_objective'),
    seeds=SEEDS,
  ),
  # Fig. 4: nuclear-norm matrix estimation, dataset I (rank 16); 9 configurations each.
  'fco_nuclear': Reproduction(
    task='nuclear',
    algorithms=FCO_ALGORITHMS,
    client_learning_rates=(3e-4, 1e-3, 3e-3),
    server_learning_rates=(1.0, 10.0, 30.0),
    rounds=200,
    checkpoints=(50, 100, 200),
    metric='frobenius_error',
    higher_is_better=False,
    select_on='train_objective',
    plot_metrics=('frobenius_error', 'rank'),
    seeds=SEEDS,
  ),
  # Wang et al. (NeurIPS 2020), Synthetic(1, 1) with local epochs ~ U(2, 5); 12 each:
  # FedAvg and FedNova over (eta_c, eta_s), FedProx over (eta_c, mu).
  'fednova_synthetic': Reproduction(
    task='synthetic',
    algorithms=('fedavg', 'fedprox', 'fednova'),
    client_learning_rates=(0.01, 0.03, 0.1, 0.3),
    server_learning_rates=(0.5, 1.0, 2.0),
    rounds=200,
    checkpoints=(50, 100, 200),
    metric='test_accuracy',
    select_on='validation_accuracy',
    task_options=dict(alpha=1.0, beta=1.0),
    settings=dict(local_epochs=2, batch_size=50),
    algorithm_options=dict(
      fedavg=dict(local_epochs_max=5),
      fedprox=dict(local_epochs_max=5),
      fednova=dict(local_epochs_max=5),
    ),
    tuning=dict(fedprox=dict(server_learning_rate=(1.0,), mu=(0.001, 0.01, 0.1))),
    plot_metrics=('train_loss', 'test_accuracy'),
    seeds=SEEDS,
  ),
  # Huang and Li (ComFedL), DRFL: one big client, nine with 20 examples; 24 each.
  'drfl_imbalanced': Reproduction(
    task='imbalanced_digits',
    algorithms=('fedavg', 'qfedavg', 'afl', 'comfedl', 'local_scgdm'),
    client_learning_rates=(0.003, 0.01, 0.03, 0.1, 0.3, 1.0),
    server_learning_rates=(1.0,),
    rounds=100,
    checkpoints=(20, 50, 100),
    metric='worst_accuracy',
    select_on='validation_worst_accuracy',
    algorithm_options=dict(comfedl=dict(local_steps=5), local_scgdm=dict(gamma=0.2, local_steps=5)),
    tuning=dict(
      fedavg=dict(server_learning_rate=(0.5, 1.0, 2.0, 4.0)),
      qfedavg=dict(q=(0.2, 1.0, 2.0, 5.0)),
      afl=dict(lambda_learning_rate=(0.01, 0.03, 0.08, 0.3)),
      comfedl=dict(gamma=(0.1, 0.2, 0.5, 1.0)),
      local_scgdm=dict(
        _SCGDM_RATE,
        momentum_rate=(0.1, 0.3, 1.0),
        beta=(0.003, 0.01, 0.03, 0.1),
        tracking_gamma=(0.3, 1.0),
      ),
    ),
    plot_metrics=('average_accuracy', 'worst_accuracy'),
    seeds=SEEDS,
  ),
}
# The harder construction: the big client holds classes 0-4, the small ones 5-9.
_BUILT_IN['drfl_imbalanced_classes'] = dataclasses.replace(
  _BUILT_IN['drfl_imbalanced'], task_options=dict(split='classes')
)
# Fallah et al. (Per-FedAvg) and Gao et al. (Local-SCGDM): sinewave, MAML objective,
# personalized evaluation (one adaptation step on held-out clients); 8 each.
_MAML_RATES = (0.001, 0.003, 0.01, 0.03)
# beta eta spans 0.01-0.03 (the others' selected rates); 0.003 was never competitive.
_SCGDM_MAML = dict(
  _SCGDM_RATE, momentum_rate=(0.2, 1.0), beta=(0.01, 0.03), tracking_gamma=(0.2, 1.0)
)
_BUILT_IN['maml_sinewave'] = Reproduction(
  task='sinewave',
  algorithms=('fedavg', 'per_fedavg_fo', 'per_fedavg_exact', 'comfedl_maml', 'local_scgdm_maml'),
  aliases=dict(
    per_fedavg_fo='per_fedavg',
    per_fedavg_exact='per_fedavg',
    comfedl_maml='comfedl',
    local_scgdm_maml='local_scgdm',
  ),
  client_learning_rates=_MAML_RATES,
  server_learning_rates=(1.0,),
  rounds=300,
  checkpoints=(100, 200, 300),
  metric='loss_after',
  higher_is_better=False,
  select_on='validation_loss_after',
  eval_period=20,
  algorithm_options=dict(
    per_fedavg_fo=dict(variant='fo', local_steps=10),
    per_fedavg_exact=dict(variant='exact', local_steps=10),
    comfedl_maml=dict(objective='maml', local_steps=10),
    local_scgdm_maml=dict(objective='maml', inner_learning_rate=0.01, local_steps=10),
  ),
  tuning=dict(
    fedavg=dict(server_learning_rate=(1.0, 2.0)),
    per_fedavg_fo=dict(alpha=(0.005, 0.01)),
    # The exact meta-gradient is larger: its rates reach 10x lower.
    per_fedavg_exact=dict(client_learning_rate=(0.0003, 0.001, 0.003, 0.01), alpha=(0.005, 0.01)),
    comfedl_maml=dict(inner_learning_rate=(0.005, 0.01)),
    local_scgdm_maml=_SCGDM_MAML,
  ),
  plot_metrics=('train/client_work/train_loss', 'loss_after'),
  seeds=SEEDS,
)
# The Local-SCGDM slides' figure: train and held-out MAML loss on sinewave against
# Local-BSGD (biased local SGD on the compositional objective: ComFedL with a large inner
# batch, each client's whole data) and FedAvg; 8 each.
_BUILT_IN['scgdm_sinewave'] = Reproduction(
  task='sinewave',
  algorithms=('local_scgdm', 'local_bsgd', 'local_moml', 'fedavg'),
  aliases=dict(local_bsgd='comfedl'),
  client_learning_rates=_MAML_RATES,
  server_learning_rates=(1.0,),
  rounds=300,
  checkpoints=(100, 200, 300),
  metric='loss_after',
  higher_is_better=False,
  select_on='validation_loss_after',
  eval_period=20,
  algorithm_options=dict(
    local_scgdm=dict(objective='maml', inner_learning_rate=0.01, local_steps=10),
    local_bsgd=dict(objective='maml', inner_learning_rate=0.01, local_steps=10),
    # The authors' sinewave code: second-order meta-gradient; its memory kept per
    # client across rounds (the paper's method); alpha as the others' inner rate.
    local_moml=dict(variant='exact', alpha=0.01, local_steps=10),
  ),
  algorithm_settings=dict(local_bsgd=dict(batch_size=20)),
  tuning=dict(
    local_scgdm=_SCGDM_MAML,
    local_bsgd=dict(server_learning_rate=(1.0, 2.0)),
    local_moml=dict(beta=(0.5, 0.9)),
    fedavg=dict(server_learning_rate=(1.0, 2.0)),
  ),
  plot_metrics=('train_loss_after', 'loss_after'),
  seeds=SEEDS,
)

# Huang and Li (ComFedL), DA-MAML setup: client i holds a fraction 0.28 of class i;
# inner (adaptation) lr 0.05, gamma 0.5, tau 5; baselines FedAvg, FedMAML (Per-FedAvg),
# TR-MAML, Ditto (scored with its personal models); 8 each.
_BUILT_IN['damaml_dominant_class'] = Reproduction(
  task='dominant_class',
  algorithms=('fedavg', 'per_fedavg', 'tr_maml', 'ditto', 'comfedl_damaml', 'local_scgdm_damaml'),
  aliases=dict(comfedl_damaml='comfedl', local_scgdm_damaml='local_scgdm'),
  client_learning_rates=(0.03, 0.1, 0.3, 1.0),
  server_learning_rates=(1.0,),
  rounds=100,
  checkpoints=(20, 50, 100),
  metric='worst_accuracy_after',
  select_on='validation_worst_accuracy_after',
  task_options=dict(adapt_lr=0.05),
  algorithm_options=dict(
    per_fedavg=dict(variant='exact', local_steps=5),
    tr_maml=dict(local_steps=5),
    comfedl_damaml=dict(objective='da_maml', inner_learning_rate=0.05, local_steps=5),
    local_scgdm_damaml=dict(
      objective='da_maml', gamma=0.5, inner_learning_rate=0.05, local_steps=5
    ),
  ),
  tuning=dict(
    fedavg=dict(server_learning_rate=(1.0, 2.0)),
    per_fedavg=dict(alpha=(0.02, 0.05)),
    tr_maml=dict(alpha=(0.02, 0.05)),
    ditto=dict(lam=(0.1, 1.0)),
    comfedl_damaml=dict(gamma=(0.2, 0.5)),
    local_scgdm_damaml=dict(
      _SCGDM_RATE, momentum_rate=(0.3, 1.0), beta=(0.1, 0.3), tracking_gamma=(0.3, 1.0)
    ),
  ),
  metric_sources=dict(
    ditto=dict(
      accuracy_after='personal_accuracy',
      worst_accuracy_after='personal_worst_accuracy',
      validation_worst_accuracy_after='validation_personal_worst_accuracy',
    )
  ),
  plot_metrics=('accuracy_after', 'worst_accuracy_after'),
  seeds=SEEDS,
)

# Nguyen et al. (FedBuff, AISTATS 2022): buffered asynchronous aggregation reaches a
# target accuracy in less simulated time than synchronous FedAvg when device speeds
# vary. Both take 10 client updates a round (server step), so equal rounds are equal
# client work; FedBuff keeps 20 clients training. EMNIST's synthetic source (learnable
# class templates in noise), 500 writers, softmax regression, lognormal devices
# (speed log-spread 1); 9 configurations each.
_BUILT_IN['fedbuff_emnist'] = Reproduction(
  task='emnist',
  algorithms=('fedavg', 'fedbuff'),
  aliases=dict(fedbuff='fedavg'),
  client_learning_rates=(0.03, 0.1, 0.3),
  server_learning_rates=(0.5, 1.0, 2.0),
  rounds=300,
  checkpoints=(100, 200, 300),
  metric='test_accuracy',
  select_on='train_accuracy',
  task_options=dict(source='synthetic', model='softmax', max_clients=500),
  settings=dict(clients_per_round=10, device_model='lognormal', device_speed_sigma=1.0),
  algorithm_settings=dict(fedbuff=dict(mode='async', concurrency=20, buffer_size=10)),
  plot_metrics=('train_loss', 'test_accuracy'),
  x_axis='time/simulated_seconds',
  target=0.6,
  seeds=SEEDS,
)

# Aggregation as a block (#56), on Synthetic(1, 1) (non-IID logistic regression), FedAvg
# with 20 clients a round, 2 client learning rates each, 3 seeds.
# Robust aggregation under attack (docs/results.md): every combiner (as labels aliasing
# fedavg) under one attack setting a grid; Krum assumes f = 4 (20% of 20), the trimmed
# mean drops 20% at each end. Baruch et al. (2019): ALIE gets past Krum and the median.
# The uniform mean weighs clients alike, as every robust combiner does (the mean weighs
# them by their examples); Multi-Krum averages the m - f rows Krum scores best; bucketing
# (s = 2, Karimireddy, He and Jaggi 2022) before Krum is the remedy for heterogeneity:
# Krum then reads 10 buckets, which take f = 3 at most (2f + 3 <= 10; the authors' code
# also checks Krum's f against the buckets' count).
ROBUST = dict(
  mean={},
  mean_uniform=dict(client_weighting='uniform'),
  median=dict(aggregator='median'),
  trimmed_mean=dict(aggregator='trimmed_mean', trim_fraction=0.2),
  krum=dict(aggregator='krum', byzantine_clients=4),
  multi_krum=dict(aggregator='multi_krum', byzantine_clients=4),
  krum_s2=dict(aggregator='krum', byzantine_clients=3, pre_aggregation='bucketing', bucket_size=2),
  geometric_median=dict(aggregator='geometric_median'),
  centered_clip=dict(aggregator='centered_clip', centered_clip_tau=0.1),
)
ATTACKS = {
  'robust_none': {},
  'robust_sign_flip_10': dict(attack='sign_flip', attack_fraction=0.1),
  'robust_sign_flip_20': dict(attack='sign_flip', attack_fraction=0.2),
  'robust_alie_10': dict(attack='alie', attack_fraction=0.1),
  'robust_alie_20': dict(attack='alie', attack_fraction=0.2),
  # ALIE's z as the authors' code sets it, not by the paper's formula (0.13-0.39 here).
  'robust_alie_20_z15': dict(attack='alie', attack_fraction=0.2, alie_z=1.5),
  # A large attack: updates of N(0, 10^2) per coordinate, which the mean cannot absorb.
  'robust_gaussian_20': dict(attack='gaussian', attack_fraction=0.2, attack_scale=10.0),
}
for _name, _attack in ATTACKS.items():
  _BUILT_IN[_name] = Reproduction(
    task='synthetic',
    algorithms=tuple(ROBUST),
    aliases={label: 'fedavg' for label in ROBUST},
    # {0.03, ..., 1} left selections at both ends (robust_alie_20_z15, EF21, signs).
    client_learning_rates=(0.01, 0.03, 0.1, 0.3, 1.0, 3.0),
    server_learning_rates=(1.0,),
    rounds=200,
    checkpoints=(50, 100, 200),
    metric='test_accuracy',
    select_on='validation_accuracy',
    task_options=dict(alpha=1.0, beta=1.0),
    settings=dict(clients_per_round=20, batch_size=50, **_attack),
    algorithm_settings=ROBUST,
    plot_metrics=('train_loss', 'test_accuracy'),
    seeds=SEEDS,
  )

# Robust aggregation under heterogeneity and its remedy (Karimireddy, He and Jaggi, ICLR
# 2022, "Byzantine-Robust Learning on Heterogeneous Datasets via Bucketing"), on their
# partition of data that ships: digits sorted by label and cut into 25 shards
# (`sorted_digits`), every client each round, one local epoch of FedAvg. Their exp1
# (IID vs sorted, no attack): Krum, the coordinate-wise median and RFA lose accuracy
# under sorting and bucketing (s = 2) recovers most of it; centered clipping holds.
# Their exp2-3 (sorted, a fixed 20% of attackers, worker momentum 0.9): ALIE, IPM and
# mimic break Krum, the median and RFA; centered clipping holds, bucketing helps.
BUCKETED = dict(pre_aggregation='bucketing', bucket_size=2)
HETEROGENEOUS = dict(
  mean={},
  median=dict(aggregator='median'),
  krum=dict(aggregator='krum', byzantine_clients=5),
  multi_krum=dict(aggregator='multi_krum', byzantine_clients=5),
  rfa=dict(aggregator='geometric_median'),
  cclip=dict(aggregator='centered_clip'),
)
HETEROGENEOUS.update(
  {
    f'{label}_s2': dict(HETEROGENEOUS[label], **BUCKETED)
    for label in ('median', 'krum', 'rfa', 'cclip')
  }
)
_DIGITS = {
  'robust_digits_iid': (dict(partition='iid'), {}),
  'robust_digits_sorted': (dict(partition='sorted'), {}),
}
_UNDER_ATTACK = dict(attack_fraction=0.2, attack_fixed=True, worker_momentum=0.9)
for _attack in (dict(attack='alie'), dict(attack='ipm', ipm_epsilon=0.1), dict(attack='mimic')):
  _DIGITS[f'robust_digits_{_attack["attack"]}'] = (
    dict(partition='sorted'),
    dict(_UNDER_ATTACK, **_attack),
  )
for _name, (_task_options, _settings) in _DIGITS.items():
  _BUILT_IN[_name] = Reproduction(
    task='sorted_digits',
    algorithms=tuple(HETEROGENEOUS),
    aliases={label: 'fedavg' for label in HETEROGENEOUS},
    client_learning_rates=(0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0),
    server_learning_rates=(1.0,),
    rounds=200,
    checkpoints=(50, 100, 200),
    metric='test_accuracy',
    select_on='validation_accuracy',
    task_options=_task_options,
    settings=dict(clients_per_round=25, **_settings),
    algorithm_settings=HETEROGENEOUS,
    plot_metrics=('train_loss', 'test_accuracy'),
    seeds=SEEDS,
  )

# Compression against the bytes a round uploads: b-bit stochastic quantization after a
# Hadamard rotation (TFF's compression), top-k, with and without error feedback.
# Karimireddy et al. (2019): error feedback recovers what top-k loses.
COMPRESSED = dict(
  fp32={},
  q8=dict(compression='quantize', quantize_bits=8, hadamard_rotation=True),
  q4=dict(compression='quantize', quantize_bits=4, hadamard_rotation=True),
  q2=dict(compression='quantize', quantize_bits=2, hadamard_rotation=True),
  top10=dict(compression='top_k', sparsity_fraction=0.1),
  top10_ef=dict(compression='top_k', sparsity_fraction=0.1, error_feedback='ef'),
  top1=dict(compression='top_k', sparsity_fraction=0.01),
  top1_ef=dict(compression='top_k', sparsity_fraction=0.01, error_feedback='ef'),
  top1_ef21=dict(compression='top_k', sparsity_fraction=0.01, error_feedback='ef21'),
  # Scaled signs, combined by majority vote (signSGD, Bernstein et al. 2019), with and
  # without error feedback on each client (Karimireddy et al. 2019).
  sign=dict(compression='sign'),
  sign_ef=dict(compression='sign', error_feedback='ef'),
)
_BUILT_IN['compression_synthetic'] = dataclasses.replace(
  _BUILT_IN['robust_none'],
  algorithms=tuple(COMPRESSED),
  aliases={label: 'fedavg' for label in COMPRESSED},
  algorithm_settings=COMPRESSED,
  plot_metrics=('train_loss', 'test_accuracy', 'comm/upload_bytes'),
)

for _name, _spec in _BUILT_IN.items():
  registry.register_reproduction(_name, _spec)

# The DP grids register themselves from their own module (this one's size).
from tff_comp.binaries import reproductions_dp  # noqa: E402, F401
