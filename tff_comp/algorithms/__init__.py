"""Registered algorithms: each module is a short composition of blocks.

Every builder takes `model_aggregator` (any `tff.aggregators` factory for the model
delta; side channels are aggregated exactly, `tff_comp.aggregators`), and those whose
server runs an optimizer take `server_optimizer`, as TFF's builders do. Registration
names each algorithm's home task (`registry.Entry`).
"""

from tff_comp.algorithms import afl
from tff_comp.algorithms import comfedl
from tff_comp.algorithms import ditto
from tff_comp.algorithms import fedavg
from tff_comp.algorithms import fedprox
from tff_comp.algorithms import feddualavg
from tff_comp.algorithms import fedmid
from tff_comp.algorithms import fednova
from tff_comp.algorithms import local_scgdm
from tff_comp.algorithms import per_fedavg
from tff_comp.algorithms import qfedavg
from tff_comp.algorithms import tr_maml
