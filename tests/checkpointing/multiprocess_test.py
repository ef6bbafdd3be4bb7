"""Checkpointer across processes: two processes (4 CPU devices each, gloo on
127.0.0.1) save one global array and their own data-iterator states (process 0
writes the checksums of all files); a single 8-device process verifies and
restores the arrays onto another mesh."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from rljax.checkpointing import Checkpointer

_PROCESS = """
import os, sys
pid, root, port = int(sys.argv[1]), sys.argv[2], sys.argv[3]
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from rljax.checkpointing import Checkpointer
mesh = jax.make_mesh((8,), ("data",))
rows = np.arange(16, dtype=np.float32).reshape(8, 2)[4 * pid : 4 * pid + 4]
w = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), rows)
step = jax.device_put(jnp.int32(3), NamedSharding(mesh, P()))
with Checkpointer(root) as ckpt:
  ckpt.save(3, {"w": w, "step": step}, data_state={"next_index": 10 + pid})
"""


def test_two_processes_save_and_one_process_restores(tmp_path):
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = str(s.getsockname()[1])
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  code = textwrap.dedent(_PROCESS)
  procs = [
    subprocess.Popen(
      [sys.executable, "-c", code, str(i), str(tmp_path), port],
      env=env,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
    )
    for i in range(2)
  ]
  for proc in procs:
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err.decode()[-2000:]
  data = tmp_path / "3" / "data"
  for i in range(2):
    text = (data / f"process_{i}-of-2.json").read_text()
    assert json.loads(text) == {"next_index": 10 + i}
  # Process 0 wrote the checksums of every process's files (restore checks).
  checksums = json.loads((tmp_path / "3" / "rljax_checksums.json").read_text())
  assert {"data/process_0-of-2.json", "data/process_1-of-2.json"} <= set(
    checksums["files"]
  )
  assert any(f.startswith("state/ocdbt.process_1/") for f in checksums["files"])
  mesh = jax.make_mesh((2, 4), ("data", "fsdp"))
  like = {
    "w": jax.ShapeDtypeStruct(
      (8, 2), jnp.float32, sharding=NamedSharding(mesh, P("fsdp"))
    ),
    "step": jax.ShapeDtypeStruct(
      (), jnp.int32, sharding=NamedSharding(mesh, P())
    ),
  }
  with Checkpointer(tmp_path) as ckpt:
    with pytest.raises(ValueError, match="different number of processes"):
      ckpt.restore(like)
    out = ckpt.restore(like, restore_data=False)
  np.testing.assert_array_equal(out.state["w"], np.arange(16.0).reshape(8, 2))
  assert int(out.state["step"]) == 3 and out.data_state is None
