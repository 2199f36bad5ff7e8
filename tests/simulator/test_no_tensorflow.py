"""The core runs with TensorFlow and Keras blocked: every module of simulator/ imports, and a
plan is derived, simulated and evaluated by the engine, without them."""

import pkgutil
import subprocess
import sys
from pathlib import Path

import simulator

BLOCKER = """
import importlib, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('tensorflow', 'keras', 'rewriter', 'autotune'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
for module in sys.argv[1:]:
    importlib.import_module(module)
import simulator
from simulator.derive import PlanParams
from simulator.engine import Engine
from tests.simulator.builders import chain, training_chain
r = simulator.simulate(chain(4))
ev = Engine.build(training_chain()).evaluate(PlanParams())
assert ev.plan.swaps
assert not {'tensorflow', 'keras', 'rewriter', 'autotune'} & {m.split('.')[0] for m in sys.modules}
print(r.peak_bytes)
"""


def test_every_core_module_runs_with_tensorflow_blocked() -> None:
    root = Path(simulator.__file__).parent
    modules = [f"simulator.{m.name}" for m in pkgutil.iter_modules([str(root)])]
    assert {"simulator.derive", "simulator.engine", "simulator.opsemantics"} <= set(modules)
    out = subprocess.run([sys.executable, "-c", BLOCKER, *modules], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 0
