"""A die's HBM as a hard constraint (issue 23 item 2): what an instance's die must hold, and how
many requests fit beside it.

A die holds (INT8, `serving.weight_bytes_per_param`) its copy of every layer's attention and of the
dense layers' FFN (data-parallel attention: every die has them), its expert slots of every MoE
layer (and of the MTP layer), the embedding and the output head; the profile's reserve (runtime,
compiled graphs, collective buffers); then, per request it serves, the KV cache of its whole
context (prompt and output, at the KV dtype: `serving.kv_bytes_per_element`) and the activations
of its tokens in a step. A request's KV lives on one die (the engine's slot i is on die i % dies).

Admission reserves a request's final context (prompt + every output token) when it joins, so a
batch never outgrows the HBM mid-flight and nothing has to be preempted: the engine never runs a
batch that does not fit. The largest batch is an output: `max_batch_per_die` at a context length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.serving.cost import kv_bytes_per_token, slots_per_die
from cmemu.emulator.model.serving.deployment import Deployment
from cmemu.emulator.model.serving.models import ModelShape, get_model

GB = 1e9
Tokens = TypeVar("Tokens", float, "npt.NDArray[np.float64]")


def weight_bytes_per_die(
    model: ModelShape, ep: int, profile: HardwareProfile = DEFAULT_PROFILE
) -> float:
    """The weights one die of an instance at expert-parallel degree `ep` holds."""
    layers = model.layers + model.mtp_layers
    moe_layers = model.moe_layers + model.mtp_layers
    params = (
        layers * model.attention_params
        + model.dense_layers * model.dense_ffn_params
        + slots_per_die(model, ep, profile) * moe_layers * model.expert_params
        + 2 * model.head_params  # the embedding and the output head
    )
    return params * profile.serving.weight_bytes_per_param


def activation_bytes_per_token(
    model: ModelShape, profile: HardwareProfile = DEFAULT_PROFILE
) -> float:
    """What one token in a step keeps live at the widest point of a layer: the residual and its
    normed copy, the queries (and their absorbed projection onto the latent KV), the attention
    output, and its expert copies going out and coming back with their FFN intermediates."""
    copies = model.top_k + model.shared_experts
    elements = (
        2 * model.hidden
        + model.heads * (model.head_dim + model.rope_dim)
        + model.heads * model.kv_lora
        + model.heads * model.head_dim
        + copies * (model.hidden + 2 * model.expert_ffn)
    )
    return elements * profile.serving.activation_bytes_per_element


@dataclass(frozen=True, kw_only=True)
class DieMemory:
    """One die of an instance: its HBM, what is fixed on it, and what each request costs."""

    hbm_bytes: float
    weights_bytes: float
    reserved_bytes: float
    kv_bytes_per_token: float
    activation_bytes_per_token: float
    tokens_per_request: int  # tokens one request runs through a step (1, or 2 with MTP)

    @property
    def free_bytes(self) -> float:
        """What is left for KV caches and activations (negative: the weights do not fit)."""
        return self.hbm_bytes - self.weights_bytes - self.reserved_bytes

    def request_bytes(self, context_tokens: Tokens) -> Tokens:
        """One request of `context_tokens` (prompt + output) in the batch (or, elementwise, one
        per element of an array of contexts)."""
        activations = self.tokens_per_request * self.activation_bytes_per_token
        return context_tokens * self.kv_bytes_per_token + activations

    def max_batch(self, context_tokens: float) -> int:
        """The largest batch of requests of `context_tokens` each that fits (0: not one)."""
        return max(0, math.floor(self.free_bytes / self.request_bytes(context_tokens) + 1e-9))


def die_memory(
    model: ModelShape, ep: int, *, mtp: bool, profile: HardwareProfile = DEFAULT_PROFILE
) -> DieMemory:
    return DieMemory(
        hbm_bytes=float(profile.npu.hbm_bytes_per_die),
        weights_bytes=weight_bytes_per_die(model, ep, profile),
        reserved_bytes=float(profile.serving.hbm_reserved_bytes_per_die),
        kv_bytes_per_token=kv_bytes_per_token(model, profile),
        activation_bytes_per_token=activation_bytes_per_token(model, profile),
        tokens_per_request=1 + (model.mtp_layers if mtp else 0),
    )


def check_weights_fit(memory: DieMemory, role: str) -> None:
    """A die whose weights and reserve alone overflow its HBM cannot serve at all: refused."""
    if memory.free_bytes <= 0:
        raise InvalidArgumentError(
            f"a {role} die's weights ({memory.weights_bytes / GB:.1f} GB) and reserve "
            f"({memory.reserved_bytes / GB:.1f} GB) do not fit its HBM "
            f"({memory.hbm_bytes / GB:.1f} GB): raise npu.hbm_bytes_per_die or the {role} EP",
            field=f"{role}.ep",
        )


def check_deployment_fits(
    d: Deployment, profile: HardwareProfile, base: HardwareProfile = DEFAULT_PROFILE
) -> None:
    """A what-if `profile` on which a role's dies no longer hold their weights and reserve,
    where `base` held them, is refused (InvalidArgumentError naming the role): a study that takes
    the model's room away is not run as if the HBM were larger. A toy layout that never fitted
    stays a toy (the engine does not hold it to HBM, the report says so)."""
    model = get_model(d.model)
    roles = (("decode", d.decode_ep, d.decode.mtp), ("prefill", d.prefill_ep, False))
    for role, ep, mtp in roles:
        memory = die_memory(model, ep(profile), mtp=mtp, profile=profile)
        if die_memory(model, ep(base), mtp=mtp, profile=base).free_bytes > 0:
            check_weights_fit(memory, role)
