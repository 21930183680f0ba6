"""Record torchao 0.18 MX training outputs into tests/adapters/data/torchao_mx_linear.npz.

Run in a throwaway virtualenv (torchao is never a dependency of lscore):
    python3.11 -m venv /tmp/ao-mx-venv
    /tmp/ao-mx-venv/bin/pip install torch==2.13.0 numpy ml_dtypes torchao==0.18.0
    /tmp/ao-mx-venv/bin/python tests/adapters/data/record_torchao_mx_linear.py
torchao 0.18's MX training layer is ``torchao.prototype.moe_training.mxfp8_linear.MXFP8Linear``
(the ``mx_mm`` autograd function; the older ``mx_formats`` ``MXLinear`` / ``MXLinearConfig`` are
gone from 0.18). With ``kernel_preference=KernelPreference.EMULATED`` it runs on the CPU: every
operand of the three GEMMs is cast by ``MXTensor.to_mx`` from the high-precision tensor along the
GEMM's reduction dimension (the transposed operands through a transposed copy), dequantized to the
input's dtype and multiplied by ``torch.mm`` in that dtype. ``MXFP8Linear`` fixes E4M3 elements
and blocks of 32; ``mx_mm`` takes other element formats, so two more cases call it directly (E5M2
output gradients; E2M1 elements, MXFP4). torchao 0.18's NVFP4 training layer
(``moe_training.nvfp4_training.NVFP4Linear``) runs only through Triton kernels and
``torch.nn.functional.scaled_mm`` (a GPU), so nothing of it is recorded here.

Each case: ``Sequential(Linear(32, 32), ReLU, Linear(32, 32))`` swapped to ``MXFP8Linear``, float32
and bfloat16 models, inputs of shape (32, 32) and (2, 16, 32) (the weight gradient's reduction
runs over the 32 rows, which must be whole blocks): the forward output, the input gradient and
every parameter gradient of one backward. The parameters, input and output gradient given are
stored once per (dtype, shape) group under ``group/<g>/``; the results per case under
``linear/<n>/``. Floating tensors are stored as their bit patterns (uint32 float32, uint16
bfloat16).
"""

import json
import pathlib

import numpy as np
import torch
import torchao
from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear, mx_mm
from torchao.prototype.mx_formats.config import (
    MXFP8Dim0CastKernelChoice,
    MXFP8Dim1CastKernelChoice,
    ScaleCalculationMode,
)
from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

OUT = pathlib.Path(__file__).with_name("torchao_mx_linear.npz")
HP = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BITS = {torch.float32: (torch.int32, np.uint32), torch.bfloat16: (torch.int16, np.uint16)}
MODES = {
    "floor": ScaleCalculationMode.FLOOR,
    "ceil": ScaleCalculationMode.CEIL,
    "even": ScaleCalculationMode.EVEN,
    "rceil": ScaleCalculationMode.RCEIL,
}
ELEM = {
    "e4m3fn": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2,
    "e2m1": torch.float4_e2m1fn_x2,
}
# (mode, element of input and weight, element of the output gradient, through MXFP8Linear)
CASES = [(m, "e4m3fn", "e4m3fn", True) for m in MODES] + [
    ("floor", "e4m3fn", "e5m2", False),
    ("rceil", "e2m1", "e2m1", False),
]


def bits(t):
    """A float32 / bfloat16 tensor's bit pattern as an unsigned NumPy array."""
    t = t.detach().contiguous()
    signed, unsigned = BITS[t.dtype]
    return t.view(signed).numpy().view(unsigned).copy()


class _MMLinear(torch.nn.Linear):
    """``nn.Linear`` through torchao's ``mx_mm`` with any element formats, emulated."""

    def __init__(self, linear, mode, elem, grad_elem):
        super().__init__(linear.in_features, linear.out_features, device="meta")
        self.weight, self.bias = linear.weight, linear.bias
        self.args = (ELEM[elem], ELEM[elem], ELEM[grad_elem], 32, KernelPreference.EMULATED)
        self.mode = MODES[mode]

    def forward(self, x):
        y = mx_mm.apply(
            x,
            self.weight,
            *self.args,
            MXFP8Dim0CastKernelChoice.TORCH,
            MXFP8Dim1CastKernelChoice.TORCH,
            self.mode,
            False,
        )
        return y + self.bias.to(y.dtype)


def swap(model, mode, elem, grad_elem, mxfp8_linear):
    """``model``'s two Linear layers replaced by torchao's MX training layers, sharing params."""
    for i in (0, 2):
        lin = model[i]
        if mxfp8_linear:
            new = MXFP8Linear(
                lin.in_features,
                lin.out_features,
                kernel_preference=KernelPreference.EMULATED,
                scale_calculation_mode=MODES[mode],
                device="meta",
            )
            new.weight, new.bias = lin.weight, lin.bias
        else:
            new = _MMLinear(lin, mode, elem, grad_elem)
        model[i] = new


def main():
    arrays = {}
    meta = {"peer": f"torchao {torchao.__version__}, torch {torch.__version__}", "linear": []}
    groups = []
    for hp_name, hp in HP.items():
        for shape in ((32, 32), (2, 16, 32)):
            g = len(groups)
            torch.manual_seed(3500 + g)
            model = torch.nn.Sequential(
                torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32)
            ).to(hp)
            params = {k: v.detach().clone() for k, v in model.state_dict().items()}
            x = (torch.randn(shape) * 3).to(hp)
            grad_out = (torch.randn(*shape[:-1], 32) * 1e-3).to(hp)
            for k, v in params.items():
                arrays[f"group/{g}/param/{k}"] = bits(v)
            arrays[f"group/{g}/x"] = bits(x)
            arrays[f"group/{g}/grad_out"] = bits(grad_out)
            groups.append((hp_name, hp, shape, params, x, grad_out))
    n = 0
    for mode, elem, grad_elem, through_layer in CASES:
        for g, (hp_name, hp, shape, params, x0, grad_out) in enumerate(groups):
            model = torch.nn.Sequential(
                torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32)
            ).to(hp)
            model.load_state_dict(params)
            swap(model, mode, elem, grad_elem, through_layer)
            x = x0.clone().requires_grad_(True)
            y = model(x)
            y.backward(grad_out)
            key = f"linear/{n}"
            arrays[f"{key}/y"] = bits(y)
            arrays[f"{key}/grad_x"] = bits(x.grad)
            for k, p in model.named_parameters():
                arrays[f"{key}/grad/{k}"] = bits(p.grad)
            meta["linear"].append(
                {
                    "key": key,
                    "group": g,
                    "mode": mode,
                    "element": elem,
                    "grad_element": grad_elem,
                    "layer": "MXFP8Linear" if through_layer else "mx_mm",
                    "dtype": hp_name,
                    "shape": list(shape),
                    "params": list(params),
                }
            )
            n += 1
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez_compressed(OUT, **arrays)
    print(
        f"wrote {OUT}: {len(meta['linear'])} linear cases in {len(groups)} groups,"
        f" {OUT.stat().st_size} bytes ({meta['peer']})"
    )


if __name__ == "__main__":
    main()
