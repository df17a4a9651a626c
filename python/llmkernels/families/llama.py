"""LLaMA (``LlamaForCausalLM``): the base every other family varies. LLaMA 2 and 3,
TinyLlama, SmolLM, ... load as this family; LLaMA 3.x's RoPE scaling is read from its config."""

from .base import Family


class Llama(Family):
    pass


FAMILY = Llama()
