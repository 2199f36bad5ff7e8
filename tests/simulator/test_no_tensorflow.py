import subprocess
import sys

BLOCKER = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('tensorflow', 'keras'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
import simulator, simulator.allocator, simulator.memory, simulator.order, simulator.trace
from tests.simulator.builders import chain
r = simulator.simulate(chain(4))
assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules
print(r.peak_bytes)
"""


def test_simulator_runs_with_tensorflow_blocked() -> None:
    out = subprocess.run([sys.executable, "-c", BLOCKER], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 0
