"""Reproduction grids as data: `Experiment` records, registered by name.

The built-in grids reproduce the seed papers' comparisons (`binaries/reproduce.py
--experiment=NAME`). A plugin adds its own, to sweep its own algorithm, with
`registry.register_experiment(name, experiment)` or an entry point in the group
`tff_comp.experiments` naming a function that returns an `Experiment`:

    [options.entry_points]
    tff_comp.experiments =
        my_sweep = my_package.sweeps:my_sweep
"""

import dataclasses

from tff_comp import registry


@dataclasses.dataclass(frozen=True)
class Experiment:
  """A grid comparison. `metric` picks the best configuration (`higher_is_better`
  orients it); `plot_metrics` are drawn side by side (default: `metric`)."""

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
  plot_metrics: tuple[str, ...] = ()
  eval_period: int = 10
  seeds: tuple[int, ...] = ()  # default: the --seed flag
  aliases: dict = dataclasses.field(default_factory=dict)  # label -> registered name
  # label -> {metric: the evaluation metric to read instead} (Ditto's personal models)
  metric_sources: dict = dataclasses.field(default_factory=dict)


FCO_ALGORITHMS = ('fedmid', 'fedmid_osp', 'feddualavg', 'feddualavg_osp')
_BUILT_IN = {
    # Yuan, Zaheer, Reddi (ICML 2021), Fig. 3: federated LASSO, dataset I.
    'fco_lasso': Experiment(
        task='lasso', algorithms=FCO_ALGORITHMS,
        client_learning_rates=(1e-4, 3e-4, 1e-3, 3e-3),
        server_learning_rates=(1.0, 3.0, 10.0, 30.0),
        rounds=500, checkpoints=(50, 100, 200, 500), metric='f1'),
    # Fig. 4: nuclear-norm matrix estimation, dataset I (rank 16).
    'fco_nuclear': Experiment(
        task='nuclear', algorithms=FCO_ALGORITHMS,
        client_learning_rates=(3e-4, 1e-3, 3e-3),
        server_learning_rates=(1.0, 10.0, 30.0),
        rounds=200, checkpoints=(50, 100, 200), metric='frobenius_error',
        higher_is_better=False, plot_metrics=('frobenius_error', 'rank')),
    # Wang et al. (NeurIPS 2020), Synthetic(1, 1) with local epochs ~ U(2, 5).
    'fednova_synthetic': Experiment(
        task='synthetic', algorithms=('fedavg', 'fedprox', 'fednova'),
        client_learning_rates=(0.01, 0.03, 0.1), server_learning_rates=(1.0,),
        rounds=200, checkpoints=(50, 100, 200), metric='test_accuracy',
        task_options=dict(alpha=1.0, beta=1.0),
        settings=dict(local_epochs=2, batch_size=50),
        algorithm_options=dict(fedavg=dict(local_epochs_max=5),
                               fedprox=dict(local_epochs_max=5, mu=0.01),
                               fednova=dict(local_epochs_max=5)),
        plot_metrics=('train_loss', 'test_accuracy')),
    # Huang and Li (ComFedL), DRFL: one big client, nine with 20 examples; 3 seeds.
    'drfl_imbalanced': Experiment(
        task='imbalanced_digits',
        algorithms=('fedavg', 'qfedavg', 'afl', 'comfedl', 'local_scgdm'),
        client_learning_rates=(0.003, 0.01, 0.03, 0.1), server_learning_rates=(1.0,),
        rounds=100, checkpoints=(20, 50, 100), metric='worst_accuracy',
        algorithm_options=dict(qfedavg=dict(q=0.2), afl=dict(lambda_learning_rate=0.08),
                               comfedl=dict(gamma=0.2, local_steps=5),
                               local_scgdm=dict(gamma=0.2, local_steps=5)),
        plot_metrics=('average_accuracy', 'worst_accuracy'), seeds=(0, 1, 2)),
}
# The harder construction: the big client holds classes 0-4, the small ones 5-9.
_BUILT_IN['drfl_imbalanced_classes'] = dataclasses.replace(
    _BUILT_IN['drfl_imbalanced'], task_options=dict(split='classes'))
# Fallah et al. (Per-FedAvg) and Gao et al. (Local-SCGDM): sinewave, MAML objective,
# personalized evaluation (one adaptation step on held-out clients); 3 seeds.
_BUILT_IN['maml_sinewave'] = Experiment(
    task='sinewave',
    algorithms=('fedavg', 'per_fedavg_fo', 'per_fedavg_exact', 'comfedl_maml',
                'local_scgdm_maml'),
    aliases=dict(per_fedavg_fo='per_fedavg', per_fedavg_exact='per_fedavg',
                 comfedl_maml='comfedl', local_scgdm_maml='local_scgdm'),
    client_learning_rates=(0.003, 0.01), server_learning_rates=(1.0,),
    rounds=300, checkpoints=(100, 200, 300), metric='loss_after', higher_is_better=False,
    eval_period=20,
    algorithm_options=dict(
        per_fedavg_fo=dict(variant='fo', alpha=0.01, local_steps=10),
        per_fedavg_exact=dict(variant='exact', alpha=0.01, local_steps=10),
        comfedl_maml=dict(objective='maml', inner_learning_rate=0.01, local_steps=10),
        local_scgdm_maml=dict(objective='maml', inner_learning_rate=0.01, local_steps=10)),
    plot_metrics=('train/client_work/train_loss', 'loss_after'), seeds=(0, 1, 2))

# Huang and Li (ComFedL), DA-MAML setup: client i holds a fraction 0.28 of class i;
# inner (adaptation) lr 0.05, gamma 0.5, tau 5; baselines FedAvg, FedMAML (Per-FedAvg),
# TR-MAML, Ditto (scored with its personal models); 3 seeds.
_BUILT_IN['damaml_dominant_class'] = Experiment(
    task='dominant_class',
    algorithms=('fedavg', 'per_fedavg', 'tr_maml', 'ditto', 'comfedl_damaml',
                'local_scgdm_damaml'),
    aliases=dict(comfedl_damaml='comfedl', local_scgdm_damaml='local_scgdm'),
    client_learning_rates=(0.03, 0.1, 0.3), server_learning_rates=(1.0,),
    rounds=100, checkpoints=(20, 50, 100), metric='worst_accuracy_after',
    task_options=dict(adapt_lr=0.05),
    algorithm_options=dict(
        per_fedavg=dict(variant='exact', alpha=0.05, local_steps=5),
        tr_maml=dict(alpha=0.05, local_steps=5),
        ditto=dict(lam=0.1),
        comfedl_damaml=dict(objective='da_maml', gamma=0.5, inner_learning_rate=0.05,
                            local_steps=5),
        local_scgdm_damaml=dict(objective='da_maml', gamma=0.5, inner_learning_rate=0.05,
                                local_steps=5)),
    metric_sources=dict(ditto=dict(accuracy_after='personal_accuracy',
                                   worst_accuracy_after='personal_worst_accuracy')),
    plot_metrics=('accuracy_after', 'worst_accuracy_after'), seeds=(0, 1, 2))

for _name, _spec in _BUILT_IN.items():
  registry.register_experiment(_name, _spec)
