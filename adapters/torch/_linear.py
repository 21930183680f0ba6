"""The shell every emulated low-precision ``nn.Linear`` shares: built from an ``nn.Linear``, the
input checked and flattened to rows, the product the subclass's, the bias added after it."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

# the input dtypes a layer quantizes (the casts read these three)
FLOATS = (torch.float32, torch.bfloat16, torch.float16)


class EmulatedLinear(nn.Linear):
    """An ``nn.Linear`` whose product ``_product(x)`` (x: the input's rows) runs on quantized
    operands under ``self.recipe``."""

    DEFAULT_RECIPE: ClassVar[str]
    recipe: Any

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
        *,
        recipe: Any = None,
    ) -> None:
        super().__init__(in_features, out_features, bias, device, dtype)
        self.recipe = self._take_recipe(self.DEFAULT_RECIPE if recipe is None else recipe)

    def _take_recipe(self, recipe: Any) -> Any:
        """``recipe`` (a name or a recipe object) resolved and checked for this layer."""
        raise NotImplementedError(f"{type(self).__name__} takes no recipe")

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: Any = None) -> Any:
        """A layer of this class that shares ``linear``'s weight and bias (``recipe`` None: the
        class's default recipe)."""
        with torch.device("meta"):
            new = cls(linear.in_features, linear.out_features, False, recipe=recipe)
        new.weight = linear.weight
        new.bias = linear.bias
        return new

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} defines no product")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """``input @ weight.T + bias`` on quantized operands; under autocast the input is first
        cast to the autocast dtype, as ``nn.Linear`` and torchao do."""
        name = type(self).__name__
        if torch.is_autocast_enabled(input.device.type):
            input = input.to(torch.get_autocast_dtype(input.device.type))
        if input.dtype not in FLOATS:
            raise TypeError(f"{name} input must be float32, bfloat16 or float16, got {input.dtype}")
        if input.ndim == 0 or input.shape[-1] != self.in_features:
            raise ValueError(
                f"{name} input's last dimension must be in_features={self.in_features}, "
                f"got shape {tuple(input.shape)}"
            )
        if input.numel() == 0:
            raise ValueError(
                f"{name} input must have at least one element (its scales come from its "
                f"amaxes), got shape {tuple(input.shape)}"
            )
        out = self._product(input.reshape(-1, self.in_features))
        out = out.reshape(*input.shape[:-1], self.out_features)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out

    def extra_repr(self) -> str:
        """``nn.Linear``'s description and the recipe's name."""
        return f"{super().extra_repr()}, recipe={self.recipe.name!r}"
