"""Model shapes, registered by name in MODELS. Each figure carries its source (`fig`); DeepSeek-R1
/ V3 from its public model card (HARDWARE.md, "Model")."""

from __future__ import annotations

from dataclasses import dataclass

from cmemu.emulator.model.errors import UnknownNameError
from cmemu.emulator.model.provenance import fig


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """A model's shape (layers, widths, experts): what the serving cost model prices."""

    name: str
    layers: int = fig(61, "pub")
    dense_layers: int = fig(3, "pub")  # the first layers have a dense FFN, the rest MoE
    hidden: int = fig(7168, "pub")
    heads: int = fig(128, "pub")
    head_dim: int = fig(128, "pub")  # the non-RoPE part of a query/key head; V has the same
    rope_dim: int = fig(64, "pub")
    kv_lora: int = fig(512, "pub")  # MLA KV compression
    q_lora: int = fig(1536, "pub")
    routed_experts: int = fig(256, "pub")
    shared_experts: int = fig(1, "pub")
    top_k: int = fig(8, "pub")
    expert_ffn: int = fig(2048, "pub")
    dense_ffn: int = fig(18432, "pub")
    vocab: int = fig(129280, "pub")
    mtp_layers: int = fig(1, "pub")
    # prompt + output tokens one request may span (the model config's max_position_embeddings:
    # 128K extended by YaRN to 163,840; vLLM reports it as max_model_len)
    context_tokens: int = fig(163_840, "pub")

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers

    @property
    def kv_elements_per_token_layer(self) -> int:
        """MLA caches the compressed KV and the RoPE key: 576 elements per token and layer."""
        return self.kv_lora + self.rope_dim

    @property
    def attention_params(self) -> int:
        """Weights of one layer's attention projections (MLA: q down/up, kv down/up, out)."""
        qk = self.head_dim + self.rope_dim
        return (
            self.hidden * self.q_lora
            + self.q_lora * self.heads * qk
            + self.hidden * (self.kv_lora + self.rope_dim)
            + self.kv_lora * self.heads * (self.head_dim + self.head_dim)
            + self.heads * self.head_dim * self.hidden
        )

    @property
    def expert_params(self) -> int:
        """One expert's gated FFN: gate, up and down projections."""
        return 3 * self.hidden * self.expert_ffn

    @property
    def dense_ffn_params(self) -> int:
        return 3 * self.hidden * self.dense_ffn

    @property
    def head_params(self) -> int:
        return self.hidden * self.vocab


MODELS: dict[str, ModelShape] = {
    "deepseek-r1": ModelShape(name="deepseek-r1"),
    "deepseek-v3": ModelShape(name="deepseek-v3"),  # the same shape
}


def get_model(name: str) -> ModelShape:
    model = MODELS.get(name)
    if model is None:
        raise UnknownNameError("model", name, MODELS, field="model")
    return model
