"""Registered algorithms: each module is a short composition of blocks."""

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
