"""What the e2e tests read back from a run: its metrics and its checkpoints' tensors (stdlib only)."""
import array
import json
import struct


def steps(path):
    """The training lines of a metrics.jsonl, by step."""
    return {r["step"]: r for r in map(json.loads, open(path)) if "loss" in r}


def tensors(path):
    """A safetensors file's F32 and BF16 tensors as flat float arrays (bf16 widened)."""
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, entry in header.items():
        raw = data[8 + n + entry["data_offsets"][0]: 8 + n + entry["data_offsets"][1]]
        if entry["dtype"] == "BF16":  # bf16 is the top half of an fp32
            raw = b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, len(raw), 2))
        elif entry["dtype"] != "F32":
            raise ValueError(f"{path}: {name} is {entry['dtype']}, not F32 or BF16")
        out[name] = array.array("f", raw)
    return out


def raw(path):
    """A safetensors file's tensors as (dtype, shape, bytes), for bit-exact comparison."""
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return {name: (entry["dtype"], entry["shape"],
                   data[8 + n + entry["data_offsets"][0]: 8 + n + entry["data_offsets"][1]])
            for name, entry in header.items()}


def shapes(path):
    """A safetensors file's tensor names with their dtype and shape."""
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return {name: (entry["dtype"], entry["shape"]) for name, entry in header.items()}


def floats(path):
    """A raw little-endian float32 file (loom forward's outputs)."""
    return array.array("f", open(path, "rb").read())


def compare(work, name, reference, n_steps, tensors_path, tolerance=1e-5, norms=True):
    """Run `name` against run `reference` (directories under `work`): the same steps 1..n_steps, each
    loss (and gradient norm, with `norms`) within `tolerance` relative, and the tensors of the file
    `tensors_path` (under each run's directory) the same names, each element within `tolerance`.
    Returns (the largest relative loss difference, the tensors' count, their largest difference)."""
    one, run = steps(f"{work}/{reference}/metrics.jsonl"), steps(f"{work}/{name}/metrics.jsonl")
    assert sorted(one) == sorted(run) == list(range(1, n_steps + 1)), (name, sorted(one), sorted(run))
    loss = max(abs(run[s]["loss"] - one[s]["loss"]) / one[s]["loss"] for s in one)
    assert loss <= tolerance, (name, loss)
    if norms:
        norm = max(abs(run[s]["grad_norm"] - one[s]["grad_norm"]) / one[s]["grad_norm"] for s in one)
        assert norm <= tolerance, (name, norm)
    theirs, mine = tensors(f"{work}/{reference}/{tensors_path}"), tensors(f"{work}/{name}/{tensors_path}")
    assert sorted(mine) == sorted(theirs), name
    diff = max(max(abs(a - b) for a, b in zip(theirs[k], mine[k])) for k in theirs)
    assert diff <= tolerance, (name, diff)
    return loss, len(theirs), diff
