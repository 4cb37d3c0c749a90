"""The reference state dict of the interop tests, built exactly as the C++ test kit builds it
(tests/testing/test_util.cpp: make_tensor, reference_state_dict, blank_like)."""
import math

import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int16,
          torch.int32, torch.int64, torch.uint8, torch.bool]


def make_tensor(dtype, shape, seed):
    numel = math.prod(shape)
    i = torch.arange(numel, dtype=torch.long)
    if dtype == torch.bool:
        out = (((i * 7 + seed) % 251) % 2).to(torch.bool)
    elif not dtype.is_floating_point:
        v = ((i * 7 + seed) % 251) - 100
        if dtype == torch.uint8:
            v = (i * 7 + seed) % 251
        out = v.to(dtype)
    else:
        out = ((((i * 7 + seed) % 251) - 100).to(torch.float64) / 4.0).to(dtype)
    return out.reshape(shape)


def reference_state_dict():
    tensors = {}
    seed = 1
    for dt in DTYPES:
        name = str(dt).replace("torch.", "")
        tensors[name + "_2d"] = make_tensor(dt, (5, 3), seed); seed += 1
        tensors[name + "_scalar"] = make_tensor(dt, (), seed); seed += 1
        tensors[name + "_empty"] = make_tensor(dt, (3, 0), seed); seed += 1
        tensors[name + "_transposed"] = make_tensor(dt, (4, 6), seed).t(); seed += 1
    model = {
        "layers.0.weight": make_tensor(torch.float32, (8, 4), 100),
        "layers.0.bias": make_tensor(torch.float32, (8,), 101),
        "layers": {"1": {"weight": make_tensor(torch.float32, (2, 8), 102)}},
    }
    state0 = {
        "step": make_tensor(torch.float32, (), 103),
        "exp_avg": make_tensor(torch.float32, (8, 4), 104),
        "exp_avg_sq": make_tensor(torch.float32, (8, 4), 105),
    }
    group = {"lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0,
             "amsgrad": False, "params": [0, 1, 2]}
    return {
        "tensors": tensors,
        "model": model,
        "optim": {"state": {0: state0}, "param_groups": [group]},
        "step": 1234,
        "big_int": 1 << 40,
        "negative": -7,
        "lr": 0.125,
        "name": "run-7 \u00e9t\u00e9",
        "flag": True,
        "nothing": None,
        "blob": b"\x00\x01\xff\x80 raw",
        "ints": [1, 2, 3],
        "mixed": ["a", 1.5, [1, 2]],
        "list_of_tensors": [make_tensor(torch.float32, (2,), 200),
                            make_tensor(torch.int64, (3,), 201)],
        "empty_dict": {},
    }


def blank_like(value):
    if isinstance(value, torch.Tensor):
        return torch.zeros_like(value, memory_format=torch.contiguous_format)
    if isinstance(value, dict):
        return {k: blank_like(v) for k, v in value.items()}
    if isinstance(value, list):
        return [blank_like(v) for v in value]
    return None


def difference(expected, actual, path=""):
    """The first difference as text, or None. Tensors: dtype, shape and bits; others: type
    and value."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return f"{path}: expected a tensor, got {type(actual).__name__}"
        if expected.dtype != actual.dtype or expected.shape != actual.shape:
            return f"{path}: expected {expected.dtype}{tuple(expected.shape)}, got {actual.dtype}{tuple(actual.shape)}"
        if not torch.equal(expected, actual):
            return f"{path}: values differ"
        return None
    if type(expected) is not type(actual):
        return f"{path}: expected {type(expected).__name__} {expected!r}, got {type(actual).__name__} {actual!r}"
    if isinstance(expected, dict):
        if list(expected.keys()) != list(actual.keys()):
            return f"{path}: keys {list(expected.keys())} != {list(actual.keys())}"
        for k in expected:
            d = difference(expected[k], actual[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(expected, (list, tuple)):
        if len(expected) != len(actual):
            return f"{path}: length {len(expected)} != {len(actual)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            d = difference(e, a, f"{path}.{i}")
            if d:
                return d
        return None
    if expected != actual:
        return f"{path}: {expected!r} != {actual!r}"
    return None
