//! What Hugging Face's modeling code keeps alive: activations of `generate`, of an encoder's
//! forward and of a training step, tensor by tensor, as transformers 5 builds them.
//!
//! Korthikanti et al.'s `34·s·b·h` per layer describes Megatron's fused kernels. HF's modules
//! hold far more, and at inference they hold whole-batch prefill tensors that a per-token
//! formula never sees. Each term below names the code it follows (transformers 5.17,
//! `models/llama/modeling_llama.py` unless said; the other families differ where
//! [`ModelType`] says) and has a unit test that fails without it.
//!
//! Notation: `T = b·s` tokens of the pass, `h` hidden, `q = heads·head_dim`, `kv = kv_heads·
//! head_dim`, `I` the MLP width, `V` the vocabulary, `c` the compute width in bytes (2 for 16-bit
//! and autocast, 4 for fp32), `r` the width of the residual stream (4 under autocast: the
//! embedding and the residual adds stay fp32).
//!
//! | term | bytes | code |
//! |---|---|---|
//! | prefill tokens | the prompt (`prompt-tokens`), else the whole context: sized as if the prompt filled it, never low | `GenerationMixin._sample`: one forward over the prompt, then one token per step |
//! | prefill, held across layers | `inputs_embeds` and the layer input, `2·T·h·c` (+`T·h·c` for scaled embeddings) | `LlamaModel.forward` keeps `inputs_embeds` in a local through the layer loop; the loop variable holds the running layer's input; `Gemma2Model` multiplies by the normaliser into a new tensor |
//! | prefill, MLP | `2·T·h·c` (residual sum, normed input) + `3·T·I·c` gated (`act(gate)`, `up`, their product alive at the `*`), `4·T·I·c` fused gate/up (the `2I` output stays alive through its chunk views), `2·T·I·c` plain, `4·T·I·c` plain through GPT-2's composed GELU (GPT-2, GPT-J, Phi: its input, two elementwise temporaries and their product) | `LlamaMLP.forward`, `Phi3MLP.forward`, BERT `BertIntermediate`, `NewGELUActivation.forward` (`PhiMLP`, `GPT2MLP`) |
//! | prefill, attention | normed input + q, k, v + the RoPE temporaries (`q·cos`, `rotate_half(q)·sin`, their sum: `3·T·q·c`) or, with q/k norms, two fp32 copies of q (`8·T·q`) | `apply_rotary_pos_emb`, `Qwen3Attention` |
//! | prefill, SDPA's mask | a boolean `b·s²` built once per forward when SDPA needs a mask (a sliding window shorter than the sequence; Falcon always), and in each attention call its conversion to the query's dtype beside the `logical_not` it is built from, `(c+1)·b·s²`; k and v repeated (no `enable_gqa` with a mask); a fused projection kept by its views beside the rotated q and k, `T·(q+kv)·c`. RoPE's temporaries are gone by then: the attention phase is the larger of the two | `masking_utils.sdpa_mask`; `FalconModel.forward` (`create_causal_mask(allow_is_causal_skip=False)`); `convert_boolean_attn_mask` in `aten/src/ATen/native/transformers/attention.cpp` (`where(mask.logical_not(), -inf, 0)`); `FalconAttention.forward`, `Phi3Attention.forward` |
//! | prefill, score matrix (eager) | repeated k and v (`2·T·q·c`) and the score tensors alive at once ([`Block::score_bytes`]: with `softmax(dtype=float32)` 10 bytes per score in bf16, 8 in fp16, whose CUDA softmax converts inside its kernel); eager's materialised mask `b·s²·c` | `eager_attention_forward`, `repeat_kv`, `masking_utils.eager_mask`; `softmax` in `aten/src/ATen/native/SoftMax.cpp` (`half_to_float` for a CUDA `Half` input only) |
//! | prefill, SDPA's kernel choice | torch's math kernel where no fused kernel takes the call: fp32 with fewer kv heads than heads (cuDNN and flash take 16-bit only, the memory-efficient kernel equal heads only), and fewer kv heads handed over without `enable_gqa` (Falcon's multi-query attention), which cuDNN and flash refuse as well ([`Pass::math_kernel`]) | `aten/src/ATen/native/transformers/cuda/sdp_utils.cpp` (`can_use_cudnn_attention`: `check_batch_size_and_num_heads_dense<true, false>`; `sdp_utils_cpp.h`: grouped heads only `if (params.enable_gqa && supports_gqa)`); `FalconAttention.forward` (`F.scaled_dot_product_attention(q, k, v, attn_mask=...)`, one kv head under `multi_query`) |
//! | prefill, SDPA's math kernel | in 16 bits fp32 copies of q, k and v (`4·T·(q+2·kv)`); the scaled q (`4·T·q`); with `enable_gqa` k and v repeated to every head (`8·T·q`); the fp32 scores, `_safe_softmax`'s fp32 output and the boolean `isneginf` of the scores, 9 bytes per score (`9·b·heads·s²`); a mask in its converted dtype (`c·b·s²`), or, causal with none handed in, its own fp32 one (`4·s²`: `ones(L, S).tril()` converted) ([`math_kernel_bytes`], [`attention_transient`]) | `_scaled_dot_product_attention_math` and `_safe_softmax` in `aten/src/ATen/native/transformers/attention.cpp` (`_safe_softmax` is `CompositeExplicitAutograd`: CUDA runs this body: `softmax`, `self.isneginf()`, `all`, `where_out` into the softmax's storage) |
//! | RMSNorm | two fp32 copies of its input at once, `8·T·h` | `LlamaRMSNorm.forward` (`to(float32)`, `pow(2)`, `* rsqrt`) |
//! | decode | one layer's key or value block being re-concatenated, `b·s·kv·c` | `DynamicLayer.update` (`torch.cat` into a new tensor) |
//! | decode, SDPA's math kernel | one query token against the whole cache, but keys copied per head: Falcon's broadcast `matmul` of k in fp32 (`4·b·s·q`) beside the fp32 copies of its 16-bit k and v (`8·b·s·kv`); fp32 with `enable_gqa`, k and v repeated and k scaled (`12·b·s·q`) ([`math_kernel_decode`]) | `_scaled_dot_product_attention_math` (`query_.to(at::kFloat)`, `matmul` broadcasting, `pre_process_group_query_attention_input`) |
//! | reserved, the stranded tensor | `HF_SLACK_INFERENCE_TENSORS` blocks of the pass's largest tensor, except an fp32 score matrix: every score tensor is then one size, each layer gets the previous layer's blocks back whole and nothing smaller splits them, unless SDPA's math kernel's per-call float mask (`4·s²`) is larger than every block outside attention ([`stranding_tensor`]) | `eager_attention_forward` (`softmax(dtype=float32)`), `_scaled_dot_product_attention_math` (`tril`, `convert_boolean_attn_mask`); `CUDACachingAllocator.cpp` `get_free_block`, `should_split` |
//! | reserved, Whisper's `generate` | the largest of its three phases, not the allocated peak plus the encoder's stranded blocks: the encoder's forward with `HF_SLACK_INFERENCE_TENSORS` blocks of its largest tensor; the first decoder call, the encoder's output and the `2·L` cross-attention copies (`seqs·positions·kv`) each in a segment rounded to 2 MiB (or a share of a 20 MiB one under 10 MiB) plus three free copy-sized blocks (two from the call: the key's and value's contiguous projections alive through the cache's `torch.cat`, `v_proj`'s output reused by it; the third not traced, likely an encoder hidden-state block), the copies taking the encoder's freed blocks first; the decode, the self-attention cache held twice by its one-token-longer copies ([`seq2seq_slack`]), or, once its copies pass 10 MiB, a segment for each copy the first call's freed blocks do not hold at every 2 MiB size it crosses ([`seq2seq_crossings`]); with beams, the encoder's output once per beam and one cross-attention copy in flight | `WhisperEncoder.forward`; `_expand_inputs_for_generation`, `EncoderDecoderCache.reorder_cache`; `WhisperAttention.forward` (`k_proj`, `v_proj`, `transpose(1, 2).contiguous()`, `EncoderDecoderCache.cross_attention_cache.update`); `DynamicLayer.update` (`torch.cat`); `CUDACachingAllocator.cpp` `get_free_block`, `get_allocation_size` |
//! | reserved, a Llama-code decoder's `generate` under SDPA's fused kernels, or eager attention with a kv head per head; Falcon-7B's `generate` (one kv head: SDPA's math kernel); Phi-3-mini's under eager attention (its sliding window included) | replaced by the replay of its requests: the weights, the prefill layer by layer and the decode steps' cache copies through the caching allocator's rules; its reserved − allocated ([`prefill_replay`], chosen by [`replayed_decoder`]) instead of the stranded tensors and the two terms below | `modeling_llama.py` (`LlamaModel`, `LlamaDecoderLayer`, `LlamaAttention`, `LlamaMLP`, `LlamaRMSNorm`, `apply_rotary_pos_emb`), `Qwen3Attention`, `DynamicLayer.update`, `eager_attention_forward` and `masking_utils.eager_mask` ([`prefill_replay`]'s `eager`); `modeling_falcon.py` (`FalconModel`, `FalconDecoderLayer`, `FalconAttention`, `FalconMLP`), `_scaled_dot_product_attention_math` ([`prefill_replay`]'s `falcon`); `modeling_phi3.py` (`Phi3Attention`, `Phi3MLP`, its `apply_rotary_pos_emb`), `create_sliding_window_causal_mask`, `DynamicSlidingWindowLayer.update` ([`prefill_replay`]'s `phi3`); `CUDACachingAllocator.cpp` |
//! | decode, the cache's copies one token longer (reserved) | each layer's key and value re-concatenated one token (`b·kv·c`) longer than the prefill block it replaces; a layer's key and value sit side by side and their freed blocks merge into one that holds the next layer's key, so one copy per layer needs a free block: the prefill's MLP intermediates, `RMSNorm` copies and its stranded slack hold as many as whole copies fit, the rest take fresh segments rounded to 2 MiB; copies of at most 1 MiB (the small pool) reuse the previous layer's freed 2 MiB segment, one new segment in all ([`cache_relocation_fresh`]) | `DynamicLayer.update` (`torch.cat`); `CUDACachingAllocator.cpp` `round_size`, `get_free_block`, `should_split`, `try_merge_blocks`, `get_allocation_size` (`allocator`) |
//! | decode, the copies outgrowing the prefill's room (reserved, replayed decoders) | past the replay's decode steps (where step 1 made segments, the larger of this and the crossings below), the copies grow to the context's size in the room the replay leaves: each stretch of a segment holding only free blocks and copies holds `floor(R / S)` copies; each 2 MiB level of the copies' size adds a segment of that size for each of the `2L` copies, plus one layer's pair in flight, the room does not hold (below 10 MiB, once, in shared 20 MiB segments). Up to the stated context; without `prompt-tokens` one level ([`prefill_replay::Replayed::outgrown_fresh`]). None for a sliding-window cache the prompt fills (Phi-3): its copies stay `window` tokens | `DynamicLayer.update` (`torch.cat`); `CUDACachingAllocator.cpp` `get_allocation_size` (`kRoundLarge`, `kLargeBuffer`), `get_free_block`, `try_merge_blocks`; checked against the same heap run through every decode step |
//! | decode, Falcon's math-kernel copies growing (reserved, replayed Falcon at batch > 1) | each decode step copies k and v broadcast to every head (`4·b·heads·S·d`, one in flight, `4·heads/c` times a cache copy); from the level the replay's last copy is in to the stated context's (one level past without `prompt-tokens`), one segment per 2 MiB level, and one 20 MiB segment below 10 MiB: an upper bound, checked against the heap run through every decode step ([`prefill_replay::Replayed::math_copies_fresh`]) | `_scaled_dot_product_attention_math` (`matmul` broadcasting); `CUDACachingAllocator.cpp` `get_allocation_size` (`kRoundLarge`, `kLargeBuffer`), segments never merge |
//! | decode, the later 2 MiB crossings (reserved) | where step 1 left copies alone in segments of their own (the term above is above 0) and a copy is at least 10 MiB: every `2 MiB / (b·kv·c)` steps the copies outgrow those segments, which no later (larger) copy fits; each crossing makes two segments of the new 2 MiB-rounded size, one layer's key and value in flight while the prefill's large blocks hold `floor(B / S)` copies each. For a replayed decoder, the larger of that and the outgrowth above from the replay's room (the copies it does not hold at each level): a short prompt's room holds few of copies that double (Qwen3-0.6B at 32 × 1,024 + 1,024 reserved 59.4 GiB on an H200 where two per crossing count 16.6; `tests/data/h200b`), and a prefill the replay lays out with less room than the GPU's reads over (Qwen3-0.6B at 32 × 8k, four copies fewer). Counted from the stated prompt's cache to the context's; without `prompt-tokens` one crossing ([`cache_crossings_fresh`]) | `DynamicLayer.update` (`torch.cat`); `CUDACachingAllocator.cpp` `get_allocation_size` (`kRoundLarge`, `kMinLargeAlloc`), `get_free_block`, `try_merge_blocks` (segments never merge); an H200 trace per decode step (`tools/measure/trace_decode.py`) |
//! | decode, a mixture of experts' reserved | the gathered gate/up and down weights (`b·k·2·I·h·c`, `b·k·I·h·c`) larger than the prefill's largest tensor take new segments on top of the prefill's (slack `P + fresh − max(P, D)` beyond the prefill's own) | `batched_mm_experts_forward` (`self.gate_up_proj[expert_ids]`); `CUDACachingAllocator.cpp` `get_free_block`, `alloc_block` ([`gathered_experts_fresh`]) |
//! | reserved, an eager prefill beyond its replay | one segment of the largest score request, `4·b·heads·s²`: the H100's `SmolLM2` rows reserved one score segment more than the exact replay of their run ([`eager_unreplayed_segment`]) | `eager_attention_forward`; `CUDACachingAllocator.cpp` `get_free_block`, `alloc_block` |
//! | generate logits | the last position's logits and their fp32 copy, `b·V·(c+4)` | `logits_to_keep=1`; `_sample` (`outputs.logits[:, -1].to(copy=True, dtype=float32)`) |
//! | training, per layer | see [`saved_per_layer`] | autograd's saved tensors per op |
//! | training, a sliding window shorter than the sequence | the boolean `b·s²` mask for the whole step; per layer SDPA's saved float mask `c·b·s²` and k, v repeated to every head | `masking_utils.sdpa_mask`; `convert_boolean_attn_mask`; the SDPA kernels' `attn_bias` saved for backward; `use_gqa_in_sdpa` (no `enable_gqa` with a mask), `repeat_kv` |
//! | training, LoRA on a mixture of experts | each adapted layer's folded expert weights, `E·3·I·h` at the frozen weights' width, saved until its backward | PEFT `ParamWrapper` (`parametrize`; `_LoraFactorsProxy.forward`: `baddbmm(W, lhs, rhs)`), the experts' `grouped_mm` saving its weight |
//! | training, Gemma-2's eager scores | `tanh`'s output, `c·b·heads·s²` per layer, beside the softmax | `Gemma2`'s `eager_attention_forward` (`softcap`: `tanh(w / softcap) * softcap`) |
//! | training, the score `bmm`s' saved inputs | q, k and v in the compute dtype (`3·T·q·c`), or in SDPA's math kernel the scaled fp32 q and fp32 k and v per head (`12·T·q`, any precision) ([`score_inputs_saved`]) | `BmmBackward` saving `self` and `mat2`; `_scaled_dot_product_attention_math` |
//! | training, attention backward | where scores exist (eager, the math kernel), the probabilities' gradient, CUDA's `grad * output` temporary and softmax's input gradient: 12 B per score in the math kernel and in fp32, `12 − c` under an fp32 softmax of 16-bit scores (whose 16-bit probabilities are freed by then; 8 for `Half`, whose input gradient is 16-bit), `3c` where softmax keeps the compute dtype ([`backward_transient`]) | `MatmulBackward`, `_softmax_backward_data` (`softmax_backward_cuda_out` in `aten/src/ATen/native/cuda/SoftMax.cu`: `Tensor tmp = grad * output`); the allocator history of Falcon-7B's LoRA on an H200 (`tests/data/h200c/traces`) |
//! | training, loss | `12·T·V`: the saved `log_softmax` output, the NLL gradient and `log_softmax`'s input gradient, all fp32, at the start of backward; Gemma-2 also saves its soft-capped logits' `tanh` output, `c·T·V` | `ForCausalLMLoss` (`logits.float()`, `cross_entropy`); `Gemma2ForCausalLM.forward` (`final_logit_softcapping`: `tanh(logits / cap) * cap`, default 30.0) |
//! | training, Gemma norms | the fp32 normed input a trained weight's `mul` saves, 4 B instead of the stream's width | `Gemma2RMSNorm.forward`, `Gemma3RMSNorm.forward` (`output * (1.0 + self.weight.float())` in fp32, then `type_as(x)`) |
//! | training, GPT-2's GELU under autocast | `pow` is on CUDA autocast's fp32 list: its input is copied to fp32 and every later op of `NewGELUActivation` promotes to fp32, so `pow`'s input, `tanh`'s output and `1 + tanh` are saved at 4 B | `NewGELUActivation.forward`; `autocast_mode.cpp` (`pow` in `CastPolicy::fp32`) |
//! | autocast weight cache | a 16-bit copy of every trainable fp32 weight a linear layer uses in forward, kept by the nodes that saved it; LoRA's fp32 factors too (`2·adapter params`: cached to the forward's end, and saved into backward without checkpointing) | `autocast_mode.cpp` `cached_cast` (leaf tensors requiring grad); PEFT `autocast_adapter_dtype` (factors kept in fp32) |
//! | training, the end of the forward under autocast | a moment of its own: every trainable linear weight's 16-bit copy is still in autocast's cache while `cross_entropy` runs, checkpointing or not, beside the 16-bit logits, their fp32 copy and `log_softmax`'s output, `(c+8)·T·V`; with checkpointing in full fine-tuning it can beat backward's start (SGD's one state tensor: SmolLM2-1.7B b4 × 2k peaks there, 21.47 GiB, oracle and H100 alike) | `autocast_mode.cpp` `cached_cast`; `torch.autocast.__exit__` (`torch.clear_autocast_cache()`); `ForCausalLMLoss` (`logits.float()`, `cross_entropy`) |
//! | reserved, a training step's loss segments | the first step's loss takes a segment per tensor: the 16-bit logits (`c·T·V`; Gemma-2 also `logits / cap`), their fp32 copy, `log_softmax`'s output and in backward `_log_softmax_backward_data`'s (`nll_loss_backward`'s takes the copy's block); the logits' segments stay free beside the fp32 ones (none in fp32, where `logits.float()` is the logits) ([`logits_segments`], [`training_slack`]) | `ForCausalLMLoss` (`logits.float()`, `cross_entropy`), `Gemma2ForCausalLM.forward` (`final_logit_softcapping`); `CUDACachingAllocator.cpp` `get_free_block`, `get_allocation_size` |
//! | reserved, a training step's layers | `HF_SLACK_INFERENCE_TENSORS` blocks of the forward's stranding tensor, or, LoRA on 16-bit weights, one of each of PEFT's three fp32 tensors at the widest adapted linear (`lora_B`'s output, `* scaling`, the promoted sum: `3·4·T·out`) ([`training_stranded`]) | `peft/tuners/lora/layer.py` `Linear.forward` (`_cast_input_dtype`, `result + lora_B(lora_A(dropout(x))) * scaling`, `.to(torch_result_dtype)`); `torch.utils.checkpoint` (each layer recomputed in backward); `CUDACachingAllocator.cpp` `should_split` |
//! | reserved, a checkpointed LoRA forward under autocast | what [`lora_replay`] leaves free by the logits (each layer's fp32 output, kept as the next checkpoint, splits a block its MLP freed), added to the layers' count ([`training_stranded`], [`replayed_lora_forward`]) | `torch.utils.checkpoint` (`use_reentrant=False`), `peft` `Linear.forward` (`_cast_input_dtype`), `CUDACachingAllocator.cpp` `get_free_block` |
//! | reserved, a LoRA step's small pool | the adapters' fp32 gradients and foreach AdamW's square roots (tensors of 1 MiB or less) take 2 MiB small-pool segments of their own beside the moments, free at the next step's peak ([`adapter_small_pool_slack`]) | `CUDACachingAllocator.cpp` (`kSmallSize`, `kSmallBuffer`), `torch/optim/adam.py` (`_init_group`, `_multi_tensor_adam`) |
//! | reserved, the optimizer state in the loss's segments | the first `optimizer.step()` makes the state beside the gradients, each tensor in the smallest free block that holds it: the layers' freed blocks (kept inputs or saved tensors, the head's, one layer's forward, the stranded blocks), then the logits' segments, then the fp32 `4·T·V` ones (the embedding's and an untied head's `V·h` tensors straight there when no layer block holds them). Each fp32 segment holding state, or each `4·T·V` the state lacks in the first step's reserve, the later steps' loss takes fresh (`ceil`, at most 3; all 3: the logits' too); under Gemma-2's soft-capping, whose `tanh` output (`c·T·V`, saved for backward) is alive beside the three fp32 tensors, one more where the state is more than one of its two logits segments holds (both then hold some: step 2's 16-bit logits split a whole fp32 one and the saved block keeps it; an H200's history, `tests/data/h200d/traces`), the total still at most 3 and no logits' segments again for it, on top of the first step's reserve or the optimizer step's peak (weights, gradients, state, foreach AdamW's `_foreach_sqrt` list) ([`training_slack`]) | `torch/optim/adamw.py` `_init_group` (`zeros_like` per parameter at the first step), `_multi_tensor_adamw` (`_foreach_sqrt`); `CUDACachingAllocator.cpp` `get_free_block`, `alloc_block` (segments never merge); the oracle's replay of the H200 rows (docs/oracle.md, "A training step's segments") |
//! | reserved, a Llama-code (Qwen3 included) full fine-tune without checkpointing in 16 bits under SDPA's fused kernels and AdamW | replaced by the replay of its requests: the weights and two training steps (forward, loss, backward, `optimizer.step()`, `zero_grad`) through the caching allocator's rules, where the first step's state pins the activation blocks it lands in and the second step's forward takes fresh segments for them; its reserved − allocated ([`train_replay`], chosen by [`replayed_training`]) instead of the two rows above; for types that only share the layout, the larger | `modeling_llama.py` (`LlamaRMSNorm`, `LlamaAttention`, `LlamaMLP`, `apply_rotary_pos_emb`), `Qwen2Attention` (biased q, k, v: `addmm`'s backward), `Qwen3Attention` (`q_norm`, `k_norm`), `ForCausalLMLoss`, `torch/optim/adam.py` (`_init_group`, `_multi_tensor_adam`), `Optimizer.zero_grad`; `CUDACachingAllocator.cpp`; the oracle's event logs (`tools/oracle/train_events.py`) |

use super::framework::Framework;
use super::{
    Checkpointing, Dtype, HF_SLACK_INFERENCE_TENSORS, Inputs, Kind, ModelType, Offload, Optimizer,
    Workload, allocator, lora_replay, prefill_replay, train_replay,
};

/// The shape of a block as HF's modeling code builds it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Block {
    pub h: f64,
    pub q: f64,
    pub kv: f64,
    pub heads: f64,
    pub ffn: f64,
    pub vocab: f64,
    pub layers: f64,
    pub mlp: Mlp,
    pub family: ModelType,
    /// Experts per token of a mixture of experts; 0 for a dense MLP.
    pub experts_per_token: f64,
    /// Experts per layer of a mixture of experts (all resident); 0 for a dense MLP.
    pub experts: f64,
    /// Tokens a sliding-window layer sees; 0 for none.
    pub sliding_window: f64,
}

/// The MLP as the modeling file writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mlp {
    /// `down(act(gate(x)) * up(x))`: Llama, Qwen, Mistral, Gemma.
    Gated,
    /// `gate_up_proj` then `chunk(2)`: Phi-3.
    FusedGated,
    /// `fc2(act(fc1(x)))`: BERT, GPT-2, Whisper.
    Plain,
}

impl Block {
    /// One projection for q, k and v (`Phi3Attention.qkv_proj`, `FalconAttention.query_key_value`),
    /// split into views that keep the whole output alive.
    fn fused_qkv(&self) -> bool {
        self.family.fused_qkv()
    }

    /// `FalconModel.forward` builds the causal mask even where SDPA could run `is_causal`
    /// (`create_causal_mask(..., allow_is_causal_skip=False)`, so that alibi can be added to it).
    fn always_masks(&self) -> bool {
        self.family == ModelType::Falcon
    }

    /// Whether SDPA is handed fewer key/value heads than query heads without `enable_gqa`.
    /// `FalconAttention.forward` calls `F.scaled_dot_product_attention` itself, with no
    /// `enable_gqa`: under multi-query attention (`multi_query`, one kv head: `_split_heads`
    /// keeps `fused_qkv[..., [-2], :]`) k and v have one head for all of q's. Falcon's new
    /// decoder architecture (Falcon-40B, several kv heads) broadcasts k and v to every head
    /// first (`torch.broadcast_to`), and the other families go through
    /// `sdpa_attention_forward`, which passes `enable_gqa` or repeats k and v (`repeat_kv`).
    fn unequal_heads_without_gqa(&self) -> bool {
        self.family == ModelType::Falcon && self.kv < self.q && self.kv * self.heads <= self.q
    }

    /// Whether SDPA is handed a boolean `b·1·s·s` mask (`masking_utils.sdpa_mask`): a sliding
    /// window shorter than the sequence, or a family that always builds one.
    fn sdpa_mask(&self, p: &Pass) -> bool {
        p.sdpa && (self.windowed(p.s) || self.always_masks())
    }

    /// `Gemma2ForCausalLM.forward` soft-caps the logits (`final_logit_softcapping`, 30.0 by
    /// default in `Gemma2Config`; `None` in Gemma-3's): `tanh` saves its output for backward.
    fn softcapped_logits(&self) -> bool {
        self.family == ModelType::Gemma2
    }

    /// Gemma-2's eager attention soft-caps its scores (`attn_logit_softcapping`, 50.0 by default
    /// in `Gemma2Config`; `None` in Gemma-3's): `eager_attention_forward` runs
    /// `tanh(w / softcap) * softcap`, and `tanh` saves its output for backward.
    fn softcapped_scores(&self) -> bool {
        self.family == ModelType::Gemma2
    }

    /// `Gemma2RMSNorm` multiplies by `1 + weight` in fp32 and casts after; Llama's casts first.
    fn fp32_norm_weight(&self) -> bool {
        matches!(self.family, ModelType::Gemma2 | ModelType::Gemma3)
    }

    fn qk_norm(&self) -> bool {
        matches!(self.family, ModelType::QkNorm | ModelType::Gemma3)
    }

    /// Norms per block: `Gemma2DecoderLayer` has four (pre/post attention, pre/post MLP).
    fn norms(&self) -> f64 {
        if matches!(self.family, ModelType::Gemma2 | ModelType::Gemma3) {
            4.0
        } else {
            2.0
        }
    }

    /// `Gemma2Model.forward`: `hidden_states = inputs_embeds * normalizer`, a new tensor while
    /// `inputs_embeds` stays referenced.
    fn scaled_embeddings(&self) -> bool {
        matches!(self.family, ModelType::Gemma2 | ModelType::Gemma3)
    }

    /// `RMSNorm` as `LlamaRMSNorm` writes it (fp32 upcast); `LayerNorm` is one fused op.
    fn rms(&self) -> bool {
        !self.layer_norm()
    }

    /// The `LayerNorm` families (BERT, Whisper, T5, GPT-2, Falcon).
    fn layer_norm(&self) -> bool {
        matches!(
            self.family,
            ModelType::LayerNorm | ModelType::Gpt2 | ModelType::Phi | ModelType::Falcon
        )
    }

    /// Rotary position embeddings (`apply_rotary_pos_emb`): the `RMSNorm` decoders and Falcon
    /// (`rotary` unless `alibi`); BERT, Whisper and GPT-2 add learned positions instead.
    fn rotary(&self) -> bool {
        self.rms() || matches!(self.family, ModelType::Falcon | ModelType::Phi)
    }

    /// Whether a sequence of `s` tokens is longer than the sliding window.
    fn windowed(&self, s: f64) -> bool {
        self.sliding_window > 0.0 && s > self.sliding_window
    }

    /// BERT's, GPT-2's and Whisper's eager attention call `softmax(w, dim=-1)` with no dtype, so
    /// in 16 bits its output is 16-bit. Under autocast it is fp32: `softmax` is on CUDA
    /// autocast's fp32 list (`autocast_mode.h`, `fp32_set_opt_dtype`: the call gets
    /// `dtype=float` unless it names one), and GPT-2's `attn_weights.type(value.dtype)` then casts it
    /// back for the `matmul` with v, which saves that cast too. Falcon's passes
    /// `dtype=hidden_states.dtype`, the residual stream's: 16-bit, fp32 under autocast. Llama's
    /// (and Phi's) pass `dtype=float32` in every precision.
    fn softmax_keeps_dtype(&self) -> bool {
        matches!(
            self.family,
            ModelType::LayerNorm | ModelType::Gpt2 | ModelType::Falcon
        )
    }

    /// GPT-2's `NewGELUActivation`: eight elementwise ops, each a new `T·I` tensor.
    fn composed_gelu(&self) -> bool {
        matches!(self.family, ModelType::Gpt2 | ModelType::Phi)
    }

    /// Linear layers fed by the attention norm's output: q, k, v, or one fused `qkv_proj`.
    fn attention_inputs(&self) -> f64 {
        if self.fused_qkv() { 1.0 } else { 3.0 }
    }

    /// Linear layers fed by the MLP norm's output: gate and up, or one.
    fn mlp_inputs(&self) -> f64 {
        match self.mlp {
            Mlp::Gated => 2.0,
            Mlp::FusedGated | Mlp::Plain => 1.0,
        }
    }

    /// Bytes per attention score alive at once when the matrix is materialised. Llama's
    /// `eager_attention_forward` runs `softmax(w, dtype=float32).to(query.dtype)`, and `ATen`'s
    /// `softmax(input, dim, dtype)` (`aten/src/ATen/native/SoftMax.cpp`) takes two roads in 16
    /// bits. A CUDA `Half` input with `dtype=Float` goes straight to `_softmax(input, dim,
    /// half_to_float=true)`, whose kernel reads fp16 and writes fp32: the masked scores (2), the
    /// fp32 output (4) and then its `to(float16)` (2) are alive together, 8 bytes. Every other
    /// 16-bit input (`BFloat16`, or any input on the CPU) is first copied whole,
    /// `input.toType(float)`, and `_softmax` runs on the copy: the scores (2), that copy (4) and
    /// the output (4), 10 bytes ([`Pass::half`]). The H100 measured the difference:
    /// SmolLM2-1.7B eager at 16 × 2,048 allocated 24.66 GiB in fp16 and 28.41 in bf16, 3.75 GiB
    /// apart, 2 bytes per score of its 16 × 32 × 1,984² (`tests/data/h100`). In fp32 the copy
    /// and the final cast are no-ops, scores and softmax 8 (torch's math kernel likewise);
    /// Phi's `eager_attention_forward` is Llama's. BERT's, GPT-2's and Whisper's
    /// `softmax` keeps the input's dtype: scores and probabilities, `2c`. Falcon's
    /// (`FalconAttention.forward`, no alibi) keeps the dtype too but holds four `c`-wide
    /// matrices: the scores, their sum with the mask, the softmax, and the previous layer's
    /// probabilities, which the attention returns and its decoder layer's output tuple keeps
    /// until the next layer's output replaces it.
    fn score_bytes(&self, p: &Pass) -> f64 {
        let c = p.c;
        if self.family == ModelType::Falcon {
            4.0 * c
        } else if self.layer_norm() && self.family != ModelType::Phi {
            2.0 * c
        } else if c < 4.0 && p.half {
            8.0
        } else if c < 4.0 {
            10.0
        } else {
            8.0
        }
    }

    /// Adapted linear layers per block under PEFT's `all-linear`.
    fn linears(&self) -> f64 {
        self.attention_inputs() + 1.0 + self.mlp_inputs() + 1.0
    }
}

/// One forward pass over `b` sequences of `s` tokens.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pass {
    pub b: f64,
    pub s: f64,
    /// Compute width in bytes.
    pub c: f64,
    /// SDPA (flash or memory-efficient kernel: no score matrix) rather than eager attention.
    pub sdpa: bool,
    /// The 16-bit type is IEEE half (fp16, and fp16 autocast), CUDA's `Half`, rather than
    /// `BFloat16`: `ATen`'s `softmax(x, dim, dtype=float32)` converts a `Half` input inside its
    /// kernel and copies any other first ([`Block::score_bytes`]).
    pub half: bool,
}

impl Pass {
    fn t(&self) -> f64 {
        self.b * self.s
    }

    /// Whether attention materialises the `b·heads·s·s` score matrix: eager attention always;
    /// SDPA when it runs its math kernel.
    fn scores(&self, block: &Block) -> bool {
        !self.sdpa || self.math_kernel(block)
    }

    /// Whether SDPA falls back to torch's math kernel, which computes `softmax(q·kᵀ)` whole. On
    /// sm90 torch 2.11 tries cuDNN, flash, then memory-efficient attention, then the math
    /// kernel (`aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`). cuDNN and flash take
    /// 16-bit inputs only, and fewer kv heads than heads only with `enable_gqa`: both run
    /// `check_batch_size_and_num_heads_dense<true, ...>` (`sdp_utils_cpp.h`), which takes the
    /// grouped-query path `if (params.enable_gqa && supports_gqa)` and otherwise requires equal
    /// heads. The memory-efficient kernel takes fp32 but never unequal heads
    /// (`check_batch_size_and_num_heads_dense<false>`). So the math kernel runs for fp32 with
    /// fewer kv heads (transformers passes `enable_gqa` when there is no mask:
    /// `integrations/sdpa_attention.py` `use_gqa_in_sdpa`), and in any precision for heads
    /// handed over unequal without `enable_gqa` ([`Block::unequal_heads_without_gqa`]).
    fn math_kernel(&self, block: &Block) -> bool {
        self.sdpa && block.kv < block.q && (self.c >= 4.0 || block.unequal_heads_without_gqa())
    }
}

/// The transient MLP bytes of one forward without autograd (see the module table).
///
/// A mixture of experts (transformers' `grouped_mm_experts_forward`, `integrations/moe.py`, the
/// prefill's kernel) sorts the `S = T·k` routed copies of the tokens by expert: the gathered
/// inputs stay while the gate/up output and its `masked_fill` copy (`4·S·I·c`), then the down
/// output, its `masked_fill`, the weighted copy and its `inv_perm` reorder (`4·S·h·c`) live.
fn mlp_transient(block: &Block, t: f64, c: f64) -> f64 {
    if block.experts_per_token > 0.0 {
        let s = t * block.experts_per_token;
        return s * c * (block.h + 4.0 * block.ffn).max(4.0 * block.h);
    }
    let live = match block.mlp {
        Mlp::Gated => 3.0,
        // NewGELU: the input, then two of its elementwise temporaries and the product.
        Mlp::Plain if block.composed_gelu() => 4.0,
        Mlp::FusedGated => 4.0,
        Mlp::Plain => 2.0,
    };
    live * t * block.ffn * c
}

/// Bytes torch's math SDPA kernel holds at its peak, inside `_safe_softmax`
/// (`_scaled_dot_product_attention_math`, `aten/src/ATen/native/transformers/attention.cpp`).
/// In 16 bits it first copies q, k and v to fp32 (`query_.to(at::kFloat)`:
/// `allowFP16BF16ReductionMathSDP` is off by default) and keeps the copies to its end; it
/// scales q into a new tensor (`query_acc * scaling_factor`); with `enable_gqa` it repeats k
/// and v to every head (`pre_process_group_query_attention_input`: `repeat_interleave`), while
/// without it `matmul` broadcasts k into a copy that is gone before the softmax. Then the fp32
/// scores (`attn`, the mask added in place) and `at::_safe_softmax(attn, -1)`: that op is
/// `CompositeExplicitAutograd`, so CUDA runs its C++ body, `out = at::softmax(self)` (fp32),
/// `masked = self.isneginf()` (a boolean per score, alive beside both) and
/// `where_out(out, all(masked), 0, out)` into the softmax's own storage: 9 bytes per score.
fn math_kernel_bytes(block: &Block, p: &Pass) -> f64 {
    let t = p.t();
    let upcast = if p.c < 4.0 {
        4.0 * t * (block.q + 2.0 * block.kv)
    } else {
        0.0
    };
    let repeated = if block.unequal_heads_without_gqa() {
        0.0
    } else {
        8.0 * t * block.q
    };
    let scores = (4.0 + 4.0 + 1.0) * p.b * block.heads * p.s * p.s;
    upcast + 4.0 * t * block.q + repeated + scores
}

/// The transient attention bytes of one forward without autograd, beyond the cache copies.
fn attention_transient(block: &Block, p: &Pass) -> f64 {
    let t = p.t();
    let projections = t * p.c * (block.q + 2.0 * block.kv);
    let position = if block.rotary() {
        // RoPE's three q-sized temporaries; q/k norms' two fp32 copies of q.
        let rope = 3.0 * t * block.q * p.c;
        if block.qk_norm() {
            rope.max(8.0 * t * block.q)
        } else {
            rope
        }
    } else {
        // BERT/Whisper: the SDPA output and its contiguous transpose.
        2.0 * t * block.q * p.c
    };
    // SDPA converts a boolean mask to the query's dtype in every call
    // (`convert_boolean_attn_mask`: `where(mask.logical_not(), -inf, 0)`): the `logical_not`
    // (1 B) and the float mask (`c`) are alive together.
    let conversion = if block.sdpa_mask(p) {
        (p.c + 1.0) * p.b * p.s * p.s
    } else {
        0.0
    };
    // A fused projection stays alive through its views beside the rotated q and k.
    let fused = if block.fused_qkv() {
        t * (block.q + block.kv) * p.c
    } else {
        0.0
    };
    if p.math_kernel(block) {
        // RoPE's temporaries are gone (q and k rebound to their rotated copies); the mask's
        // `logical_not` died with its conversion, the converted mask (`c`) is the kernel's.
        // Without a mask handed in the kernel is causal and builds its own: `ones(L, S, bool)
        // .tril()` converted to the scores' fp32 (`4·s²`), alive at the softmax.
        let mask = if block.sdpa_mask(p) {
            p.c * p.b * p.s * p.s
        } else if p.s > 1.0 {
            4.0 * p.s * p.s
        } else {
            0.0
        };
        return t * block.h * p.c + projections + fused + mask + math_kernel_bytes(block, p);
    }
    if p.scores(block) {
        // Eager: the score matrix (`Block::score_bytes` per score) and k and v repeated to
        // every head (`repeat_kv`), beside RoPE's outputs.
        return t * block.h * p.c
            + projections
            + position
            + 2.0 * t * block.q * p.c
            + block.score_bytes(p) * p.b * block.heads * p.s * p.s
            + conversion;
    }
    // With a window's mask SDPA gets no `enable_gqa` (`use_gqa_in_sdpa`): k and v are
    // repeated.
    let repeat = if block.windowed(p.s) && block.kv < block.q {
        2.0 * t * block.q * p.c
    } else {
        0.0
    };
    // RoPE's temporaries are freed (q and k rebound to their rotated copies) before SDPA runs.
    t * block.h * p.c + projections + position.max(repeat + fused + conversion)
}

/// Activation bytes at the peak of one forward pass without autograd (a prefill, or an
/// encoder's forward), beyond the weights and the KV cache.
pub(super) fn forward_peak(block: &Block, p: &Pass) -> f64 {
    let t = p.t();
    let hidden = t * block.h * p.c;
    let held = if block.scaled_embeddings() {
        3.0 * hidden
    } else {
        2.0 * hidden
    };
    // A pre-norm block holds the residual sum and the normed input through its MLP; BERT's
    // post-LN block feeds the MLP the attention output itself.
    let mlp_inputs = if block.family == ModelType::LayerNorm && block.mlp == Mlp::Plain {
        hidden
    } else {
        2.0 * hidden
    };
    let mlp = mlp_inputs + mlp_transient(block, t, p.c);
    let norm = if block.rms() {
        8.0 * t * block.h
    } else {
        hidden
    };
    // The eager mask is built once per forward and lives through every layer (a decoder's
    // causal mask, `masking_utils.eager_mask`; an encoder without padding gets none). SDPA's
    // causal mask is skipped (`_ignore_causal_mask_sdpa`), but not a sliding window's once
    // the sequence is longer than the window, nor Falcon's: a boolean `b·s·s` (`sdpa_mask`).
    let mask = if !p.sdpa && (!block.layer_norm() || block.always_masks()) {
        p.b * p.s * p.s * p.c
    } else if block.sdpa_mask(p) {
        p.b * p.s * p.s
    } else {
        0.0
    };
    held + mask + mlp.max(attention_transient(block, p)).max(norm)
}

/// The largest single tensor of a forward pass: an MLP intermediate (the fused gate/up output
/// is two wide), an fp32 copy in a norm, or eager attention's fp32 softmax.
pub(super) fn largest_tensor(block: &Block, p: &Pass) -> f64 {
    let scores = if p.scores(block) {
        4.0 * p.b * block.heads * p.s * p.s
    } else {
        0.0
    };
    largest_outside_attention(block, p).max(scores)
}

/// The largest tensor of a forward pass outside a materialised score matrix.
fn largest_outside_attention(block: &Block, p: &Pass) -> f64 {
    let t = p.t();
    let mlp = if block.experts_per_token > 0.0 {
        t * block.experts_per_token * p.c * (2.0 * block.ffn).max(block.h)
    } else {
        t * block.ffn
            * p.c
            * if block.mlp == Mlp::FusedGated {
                2.0
            } else {
                1.0
            }
    };
    let norm = if block.rms() { 4.0 * t * block.h } else { 0.0 };
    mlp.max(norm)
}

/// The tensor whose blocks a forward pass strands, in [`slack`]'s count of them. In fp32 every
/// tensor of a materialised score matrix (the scores, the softmax, its `to(float32)`, which is
/// the same tensor; torch's math kernel likewise) is `4·b·heads·s²`: each layer asks for the
/// same sizes the previous layer freed, the caching allocator's best fit hands back those very
/// blocks (`get_free_block`), and the layer's other requests take the smaller free blocks
/// first, so the score blocks are never split and strand nothing; the largest tensor outside
/// attention counts instead. SDPA's math kernel upcasts 16-bit inputs, so its scores are fp32 in
/// any precision (Falcon-7B's bf16 `generate`: the H100 row's replay strands no score block).
/// Two cases keep the scores counted:
/// - 16 bits outside the math kernel: the scores (`c` per score) and softmax's fp32 copy (4) differ in size, a 16-bit
///   request takes half of a freed fp32 block when no 16-bit one is free, and the next fp32
///   request finds none whole;
/// - SDPA's math kernel builds its float mask in every call (`_scaled_dot_product_attention_math`:
///   `ones(L, S, bool).tril()` under `is_causal`, then `convert_boolean_attn_mask`), `4·s²`
///   (`4·b·s²` for a mask handed in): when that is larger than every block outside attention,
///   the only free block that holds it is a freed score block, which it splits, and the next
///   score request takes a fresh segment (the oracle's replay of Qwen2.5-0.5B fp32 at 1 × 16,352
///   made a third 14,282 MiB segment right after its 1,020 MiB mask).
fn stranding_tensor(block: &Block, p: &Pass) -> f64 {
    let outside = largest_outside_attention(block, p);
    let math_mask = if p.sdpa {
        4.0 * p.s * p.s * if block.sdpa_mask(p) { p.b } else { 1.0 }
    } else {
        0.0
    };
    // The math kernel computes in fp32 whatever its inputs (`_scaled_dot_product_attention_math`
    // upcasts 16-bit q, k and v while `allowFP16BF16ReductionMathSDP` is off): Falcon's bf16
    // multi-query attention has fp32 scores too.
    let fp32_scores = p.c >= 4.0 || p.math_kernel(block);
    if fp32_scores && math_mask <= outside {
        outside
    } else {
        largest_tensor(block, p)
    }
}

/// q, k and v as a training step's score `bmm`s save them for backward: in the compute dtype
/// (`3·T·q·c`, k and v already repeated to every head), or, in SDPA's math kernel, the scaled
/// fp32 q and the fp32 k and v broadcast to every head (`12·T·q` in any precision: the kernel
/// upcasts 16-bit inputs, `_scaled_dot_product_attention_math`).
fn score_inputs_saved(block: &Block, p: &Pass, c: f64) -> f64 {
    let per = if p.math_kernel(block) { 12.0 } else { 3.0 * c };
    per * p.t() * block.q
}

/// Extra bytes of one decode step of `generate`: one layer's key (or value) block while
/// `torch.cat` builds its successor.
pub(super) fn decode_step(block: &Block, p: &Pass, kv_bytes: f64) -> f64 {
    let (b, s, c) = (p.b, p.s, p.c);
    // A mixture of experts decodes with `batched_mm_experts_forward`: each of the `b·k` routed
    // tokens gathers its expert's gate/up and down matrices (`self.gate_up_proj[expert_ids]`),
    // both alive at the down projection: `b·k·3·I·h·c`.
    let experts = b * block.experts_per_token * 3.0 * block.ffn * block.h * c;
    (b * s * block.kv * kv_bytes)
        .max(experts)
        .max(math_kernel_decode(block, p))
}

/// Bytes SDPA's math kernel holds in one decode step, one query token against the whole cache
/// (`_scaled_dot_product_attention_math`): the scores are one row per head, but the keys and
/// values are not. Without `enable_gqa` (Falcon's one KV head), `matmul` broadcasts k to every
/// head into a contiguous fp32 copy (`4·b·s·q`; v's comes after k's is gone), beside the fp32
/// copies of the 16-bit k and v (`query_.to(at::kFloat)`, `8·b·s·kv`). With `enable_gqa` in
/// fp32, `repeat_interleave` copies k and v to every head and the kernel scales k into a third
/// (`12·b·s·q`). Zero where a fused kernel runs.
fn math_kernel_decode(block: &Block, p: &Pass) -> f64 {
    if !p.math_kernel(block) {
        return 0.0;
    }
    let (b, s) = (p.b, p.s);
    if block.unequal_heads_without_gqa() {
        let upcast = if p.c < 4.0 {
            8.0 * b * s * block.kv
        } else {
            0.0
        };
        4.0 * b * s * block.q + upcast
    } else {
        12.0 * b * s * block.q
    }
}

/// The last position's logits and `generate`'s fp32 copy of them.
pub(super) fn generate_logits(block: &Block, sequences: f64, c: f64) -> f64 {
    sequences * block.vocab * (c + 4.0)
}

/// Numeric regime of a training step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Precision {
    /// Weights, activations and optimizer state in bf16/fp16.
    Pure16,
    /// fp32 weights under `torch.autocast` to 16 bits: linears in 16 bits, norms, residual
    /// stream and loss in fp32.
    Autocast,
    Fp32,
}

impl Precision {
    /// Width of the linears' outputs.
    fn c(self) -> f64 {
        match self {
            Self::Pure16 | Self::Autocast => 2.0,
            Self::Fp32 => 4.0,
        }
    }

    /// Width of the residual stream (embedding output, residual adds, norm outputs).
    fn r(self) -> f64 {
        match self {
            Self::Pure16 => 2.0,
            Self::Autocast | Self::Fp32 => 4.0,
        }
    }
}

/// Who trains: every weight, or PEFT LoRA adapters of this rank on every linear layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Trainable {
    All,
    Lora(f64),
}

/// Bytes a linear layer saves of an input of `width` bytes per element, per element: the
/// input itself when its weight trains (once per tensor, `shared`), else what the adapter's
/// `lora_A` saves. PEFT casts the input to the adapter's dtype first
/// (`LoraLayer._cast_input_dtype`), and the adapters are fp32 (`autocast_adapter_dtype=True`),
/// so a 16-bit input gets an fp32 copy per adapted layer; under autocast `lora_A` instead runs
/// in 16 bits on autocast's own cast. Autocast casts every linear's fp32 input separately
/// (activations are not cached, `cached_cast` caches only leaf weights).
fn consumer_saved(trainable: Trainable, prec: Precision, width: f64, consumers: f64) -> f64 {
    match (trainable, prec) {
        (Trainable::All, Precision::Autocast) if width > 2.0 => 2.0 * consumers,
        (Trainable::All, _) | (Trainable::Lora(_), Precision::Fp32) => width,
        (Trainable::Lora(_), Precision::Pure16) => 4.0 * consumers,
        (Trainable::Lora(_), Precision::Autocast) => 2.0 * consumers,
    }
}

/// Bytes one norm saves per element of its input, beyond what its consumers save.
/// `LlamaRMSNorm`: `pow(2)` and `* rsqrt` save the fp32 input (a new tensor unless the stream
/// is fp32 already), and `weight * x.to(input_dtype)` saves `x` when the weight trains
/// (Gemma's `output * (1.0 + weight.float())` saves the fp32 `output`).
/// `F.layer_norm` saves its input (autocast runs it in fp32).
fn norm_saved(block: &Block, trainable: Trainable, prec: Precision) -> f64 {
    if !block.rms() {
        return prec.r().max(if prec == Precision::Autocast {
            4.0
        } else {
            0.0
        });
    }
    4.0 + match trainable {
        Trainable::All if block.fp32_norm_weight() => 4.0,
        Trainable::All => prec.r(),
        Trainable::Lora(_) => 0.0,
    }
}

/// Bytes autograd saves in one block during a training forward without recomputation, for `T`
/// tokens (`b` sequences of `s`). Per op (`torch/csrc/autograd/generated` formulas: a `mul`
/// saves the operand the other's gradient needs, `linear` its input for the weight gradient,
/// `silu`/`gelu` their input, SDPA's flash/efficient kernels q, k, v, output and log-sum-exp):
///
/// - each norm: [`norm_saved`]; its consumers: [`consumer_saved`] (q, k, v or the fused
///   `qkv_proj`; gate and up);
/// - q/k norms (Qwen3): the fp32 copies of q and k, and their 16-bit casts when trained;
/// - attention: SDPA's q (after `RoPE`), k, v, output (`c` each) and fp32 log-sum-exp per head and
///   token; with a fused `qkv_proj` v is a view that keeps the whole projection alive; eager:
///   q, the repeated k and v, the fp32 softmax and its 16-bit cast (`(4+c)·b·heads·s²`), or for
///   a softmax that keeps its input's dtype (BERT, GPT-2, Whisper, Falcon) its `c`-wide output,
///   the fp32 one and its cast again under autocast ([`Block::softmax_keeps_dtype`]);
/// - `o_proj`'s input (the contiguous transpose of the attention output): [`consumer_saved`];
/// - MLP, gated: `gate` (by `act`), `act(gate)` and `up` (by the product), the product (by
///   `down`, as [`consumer_saved`]); fused gate/up: the `2I` output (both chunks are views of
///   it) instead of gate and up; plain: `fc1`'s output (by `gelu`) and `fc2`'s input;
/// - LoRA: each adapter's `lora_A` output (rank wide, fp32 or autocast's 16 bits) saved by
///   `lora_B`.
pub(super) fn saved_per_layer(
    block: &Block,
    p: &Pass,
    trainable: Trainable,
    prec: Precision,
) -> f64 {
    let t = p.t();
    let (c, r) = (prec.c(), prec.r());
    let norms = block.norms() * norm_saved(block, trainable, prec) * t * block.h;
    let attn_in = consumer_saved(trainable, prec, r, block.attention_inputs()) * t * block.h;
    let mlp_in = consumer_saved(trainable, prec, r, block.mlp_inputs()) * t * block.h;
    let qk_norm = if block.qk_norm() {
        let trained = if trainable == Trainable::All { c } else { 0.0 };
        (4.0 + trained) * t * (block.q + block.kv)
    } else {
        0.0
    };
    let v = if block.fused_qkv() {
        block.q + 2.0 * block.kv
    } else {
        block.kv
    };
    // The score path saves the fp32 softmax and, in 16 bits, its cast (`matmul` with v);
    // in fp32 they are one tensor. A softmax that keeps its input's dtype saves its 16-bit
    // output, except under autocast (see `Block::softmax_keeps_dtype`). SDPA's math kernel
    // saves its fp32 `_safe_softmax` output, for that op's backward and the `matmul` with v,
    // in every precision (its 16-bit cast of the probabilities is returned and dropped).
    let attention = if p.scores(block) {
        let per_score = if p.math_kernel(block) {
            4.0
        } else if block.softmax_keeps_dtype() && prec != Precision::Autocast {
            c
        } else {
            4.0 + if c < 4.0 { c } else { 0.0 }
        } + if block.softcapped_scores() { c } else { 0.0 };
        score_inputs_saved(block, p, c) + per_score * p.b * block.heads * p.s * p.s
    } else if block.windowed(p.s) {
        // A window shorter than the sequence hands SDPA a boolean mask, converted to the
        // query's dtype in every call (`convert_boolean_attn_mask`) and saved as the kernel's
        // `attn_bias` for backward; with a mask transformers passes no `enable_gqa`
        // (`use_gqa_in_sdpa`), so k and v are saved repeated to every head (`repeat_kv`).
        let (k, v) = if block.kv < block.q {
            (block.q, block.q)
        } else {
            (block.kv, v)
        };
        c * t * (2.0 * block.q + k + v) + 4.0 * t * block.heads + c * p.b * p.s * p.s
    } else {
        c * t * (2.0 * block.q + block.kv + v) + 4.0 * t * block.heads
    };
    let o_in = consumer_saved(trainable, prec, c, 1.0) * t * block.q;
    let mlp = match block.mlp {
        Mlp::Gated | Mlp::FusedGated => 3.0 * c * t * block.ffn,
        // NewGELU saves its input (`pow`), `tanh`'s output and the product's two operands
        // (`0.5 * x` and `1 + tanh`). Under autocast `pow` runs in fp32 (CUDA's fp32 list) on
        // an fp32 copy of its input, and the ops after it promote to fp32: three of the four
        // are 4 B wide; `0.5 * x` stays 16-bit.
        Mlp::Plain if block.composed_gelu() => {
            let wide = if prec == Precision::Autocast { 4.0 } else { c };
            (3.0 * wide + c) * t * block.ffn
        }
        Mlp::Plain => c * t * block.ffn,
    } + consumer_saved(trainable, prec, c, 1.0) * t * block.ffn;
    let lora = match trainable {
        Trainable::Lora(rank) => {
            let width = if prec == Precision::Autocast {
                2.0
            } else {
                4.0
            };
            block.linears() * width * t * rank + expert_weights_folded(block, prec)
        }
        Trainable::All => 0.0,
    };
    norms + attn_in + mlp_in + qk_norm + attention + o_in + mlp + lora
}

/// PEFT adapts a mixture of experts' stacked 3-D expert parameters through `ParamWrapper`, a
/// `torch.nn.utils.parametrize` parametrization: every forward folds the adapter into a new
/// full-size weight (`_LoraFactorsProxy.forward`: `torch.baddbmm(W, lhs, rhs, alpha=scaling)`,
/// in `W`'s dtype with autocast off), and the experts' `grouped_mm` saves that weight for the
/// input's gradient. So each adapted layer keeps a copy of its `gate_up_proj` and `down_proj`
/// stacks, `E·3·I·h` in the frozen weights' width, until its backward.
fn expert_weights_folded(block: &Block, prec: Precision) -> f64 {
    if block.experts > 1.0 {
        block.experts * 3.0 * block.ffn * block.h * prec.r()
    } else {
        0.0
    }
}

/// Bytes LoRA's dropout adds per block when its probability is above 0: each adapted layer's
/// `lora_dropout` (`nn.Dropout`, not PEFT's `nn.Identity`) saves its boolean mask (1 B per
/// input element), and its output replaces the input copy `lora_A` saved; in fp32, where
/// `lora_A` saved the shared input itself, the dropped-out copy is new (4 B more).
/// (`peft/tuners/lora/layer.py`, `Linear.forward`: `lora_B(lora_A(dropout(x)))`.)
pub(super) fn lora_dropout_saved(block: &Block, p: &Pass, prec: Precision) -> f64 {
    let per = 1.0 + if prec == Precision::Fp32 { 4.0 } else { 0.0 };
    let inputs =
        block.attention_inputs() * block.h + block.q + block.mlp_inputs() * block.h + block.ffn;
    per * p.t() * inputs
}

/// What stays saved after the blocks: the final norm and, when the head trains, its input.
pub(super) fn head_saved(block: &Block, p: &Pass, trainable: Trainable, prec: Precision) -> f64 {
    let t = p.t();
    let head_in = if trainable == Trainable::All {
        consumer_saved(trainable, prec, prec.r(), 1.0)
    } else {
        0.0
    };
    (norm_saved(block, trainable, prec) + head_in) * t * block.h
}

/// The loss's peak at the start of backward: `ForCausalLMLoss` upcasts the logits
/// (`logits.float()`) and `cross_entropy` saves `log_softmax`'s fp32 output; backward then holds
/// the NLL gradient and `log_softmax`'s input gradient beside it: three fp32 `T·V` tensors. (At
/// the end of forward the 16-bit logits, their fp32 copy and the saved output are `(c+8)·T·V`,
/// never more than 12 for `c <= 4`.) Gemma-2's soft-capped logits add `tanh`'s saved output.
pub(super) fn loss_peak(block: &Block, tokens: f64, prec: Precision) -> f64 {
    (12.0 + softcap_saved(block, prec)) * tokens * block.vocab
}

/// The loss's tensors at the end of the forward, while `cross_entropy` runs: the model's
/// logits in the compute width (`lm_head`'s output, held by `LlamaForCausalLM.forward`), their
/// fp32 copy (`ForCausalLMLoss`: `logits.float()`) and `log_softmax`'s fp32 output, `(c+8)·T·V`;
/// Gemma-2's soft-capped logits add `tanh`'s saved output.
pub(super) fn loss_forward_end(block: &Block, tokens: f64, prec: Precision) -> f64 {
    (prec.c() + 8.0 + softcap_saved(block, prec)) * tokens * block.vocab
}

/// Bytes per logit `tanh` saves in Gemma-2's soft-capped logits (`final_logit_softcapping`).
fn softcap_saved(block: &Block, prec: Precision) -> f64 {
    if block.softcapped_logits() {
        prec.c()
    } else {
        0.0
    }
}

/// The loss's largest tensor: one fp32 `T·V` block.
pub(super) fn loss_tensor(block: &Block, tokens: f64) -> f64 {
    4.0 * tokens * block.vocab
}

/// Bytes a layer's backward allocates beside its saved tensors: the gradients of the MLP's
/// product, `act(gate)` and `up` alive together (`MulBackward0`), or, where attention
/// materialised its scores (eager, the math kernel), what the softmax's backward holds beside
/// the saved probabilities. On CUDA `_softmax_backward_data` (`softmax_backward_cuda_out`,
/// `aten/src/ATen/native/cuda/SoftMax.cu`) first makes `Tensor tmp = grad * output`, a
/// temporary the size of the probabilities, then writes the input gradient: the probabilities'
/// gradient, `tmp` and the input gradient are alive together. Per score:
/// - SDPA's math kernel (fp32 scores in every precision): 4 + 4 + 4;
/// - a softmax that keeps the compute dtype (GPT-2, BERT, Whisper, Falcon eager; not under
///   autocast, whose fp32 list takes `softmax`): `3c`;
/// - `softmax(dtype=float32)` (the Llama code, Phi): the fp32 gradient (`ToCopyBackward` of the
///   cast back to `q`'s dtype; the 16-bit gradient and the saved 16-bit probabilities are freed
///   by then, with that node and the `matmul`'s), `tmp` and the input gradient, fp32, or for
///   `Half` in 16 bits (its `half_to_float` kernel writes it in the input's dtype; not under
///   autocast, whose scores reach softmax in fp32): `12 − c` in 16 bits (10 for bf16 and
///   autocast, 8 for fp16), 12 in fp32.
///
/// The allocator histories on an H200 (`tests/data/h200c/traces`) show each: Falcon-7B's LoRA
/// holds four fp32 score blocks at its peak with the saved probabilities (the oracle's CPU run has
/// no `tmp` and holds three); eager Mistral-7B and Phi-2 in bf16 hold the saved fp32
/// probabilities, their fp32 gradient, the fp32 input gradient (the structured kernel's output,
/// allocated first) and `tmp`, 16 B per score, with the 16-bit probabilities freed; in fp16 the
/// input gradient is 16-bit, 14. (An adapter's fp32 input gradient comes when that input's saved
/// copy is released.)
pub(super) fn backward_transient(block: &Block, p: &Pass, prec: Precision) -> f64 {
    let mlp = 3.0 * prec.c() * p.t() * block.ffn;
    if !p.scores(block) {
        return mlp;
    }
    let per_score = if p.math_kernel(block) {
        12.0
    } else if block.softmax_keeps_dtype() && prec != Precision::Autocast {
        3.0 * p.c
    } else if p.c < 4.0 {
        // `half_to_float` takes a `Half` input only; under autocast the scores reach softmax in
        // fp32 (their add with the mask, which `masking_utils` builds in the fp32 embeddings'
        // dtype, promotes them), so the input gradient is fp32 there whatever the 16-bit type.
        let input_gradient = if p.half && prec == Precision::Pure16 {
            p.c
        } else {
            4.0
        };
        8.0 + input_gradient - p.c
    } else {
        12.0
    };
    mlp.max(per_score * p.b * block.heads * p.s * p.s)
}

/// Gradient checkpointing the HF way (`gradient_checkpointing_enable`, non-reentrant
/// `torch.utils.checkpoint` around each decoder layer): each layer keeps its input (the
/// residual stream, `r·T·h`), and backward recomputes one layer at a time.
pub(super) fn checkpointed_per_layer(block: &Block, p: &Pass, prec: Precision) -> f64 {
    prec.r() * p.t() * block.h
}

/// What a training step's forward leaves saved for backward.
pub(super) struct Saved {
    /// One layer's saved tensors (with LoRA's dropout masks).
    pub layer: f64,
    /// Every layer's, through the step: all of them, or under checkpointing their inputs.
    pub kept: f64,
    /// What stays saved after the blocks ([`head_saved`]).
    pub head: f64,
}

impl Inputs {
    fn trainable(&self) -> Trainable {
        if self.workload.is_adapter() {
            Trainable::Lora(self.lora_rank)
        } else {
            Trainable::All
        }
    }

    /// The tensors a training step's forward saves ([`Saved`]).
    pub(super) fn saved(&self, block: &Block, pass: &Pass) -> Saved {
        let trainable = self.trainable();
        let prec = self.precision();
        let dropout = if self.workload.is_adapter() && self.lora_dropout > 0.0 {
            lora_dropout_saved(block, pass, prec)
        } else {
            0.0
        };
        let layer = saved_per_layer(block, pass, trainable, prec) + dropout;
        let kept = if self.checkpointing == Checkpointing::Full {
            block.layers * checkpointed_per_layer(block, pass, prec)
        } else {
            block.layers * layer
        };
        Saved {
            layer,
            kept,
            head: head_saved(block, pass, trainable, prec),
        }
    }

    /// The block as HF's modeling code builds it (per tensor-parallel rank: HF's path runs on
    /// one GPU here).
    pub(super) fn block(&self) -> Block {
        let a = &self.arch;
        let mlp = match self.family {
            family if family.fused_gate_up() => Mlp::FusedGated,
            ModelType::LayerNorm | ModelType::Gpt2 | ModelType::Phi | ModelType::Falcon => {
                Mlp::Plain
            }
            // The shape's own hint, as `params_of` reads it.
            ModelType::Other if a.intermediate_size == 4 * a.hidden_size => Mlp::Plain,
            // Llama, Qwen3's q/k norms, Gemma 2 and 3, and any other type: gate, up and down.
            ModelType::Llama
            | ModelType::QkNorm
            | ModelType::Gemma2
            | ModelType::Gemma3
            | ModelType::Phi3
            | ModelType::Other => Mlp::Gated,
        };
        Block {
            h: f64::from(a.hidden_size),
            q: f64::from(a.attention_heads) * f64::from(a.head_dim),
            kv: f64::from(a.kv_heads) * f64::from(a.head_dim),
            heads: f64::from(a.attention_heads),
            ffn: f64::from(a.intermediate_size),
            vocab: f64::from(a.vocab_size),
            layers: f64::from(a.layers),
            mlp,
            family: self.family,
            experts_per_token: self.experts_per_token,
            experts: self.experts,
            sliding_window: self.sliding_window,
        }
    }

    /// Whether transformers' own modules run this pod on one GPU, so [`hf`] counts its
    /// activations: an HF engine (or none named), no parallelism or sharding, no offload; for
    /// training full fine-tuning or LoRA in 16 bits, fp32 or autocast, without or with full
    /// checkpointing (QLoRA runs bitsandbytes' kernels and PEFT's k-bit preparation, selective
    /// recomputation is not HF's).
    pub(super) fn hf_modules(&self) -> bool {
        let single = !self.multi_gpu() && self.zero == 0 && self.offload == Offload::None;
        // A pod that names no engine is taken to run transformers' modules: the most common
        // stack, and the one that holds the most.
        let framework = match &self.engine {
            None => true,
            Some(e) => e.framework().is_some_and(Framework::runs_hf_modules),
        };
        let training_ok = match self.workload {
            Workload::Inference => true,
            // The causal-LM loss and decoder blocks only: an encoder's head (classification,
            // masked LM) and an encoder-decoder's two stacks are left to the general terms.
            Workload::Training | Workload::Lora => {
                matches!(
                    self.dtype,
                    Dtype::Bf16 | Dtype::Fp16 | Dtype::Fp32 | Dtype::Fp16Amp
                ) && self.checkpointing != Checkpointing::Selective
                    && self.kind == Kind::Decoder
            }
            Workload::Qlora => false,
        };
        single && framework && training_ok && !matches!(self.kind, Kind::Diffusion(_))
    }

    /// Autocast's 16-bit weight copies alive at the end of the forward, inside the
    /// `torch.autocast` region where `ForCausalLMLoss` runs. `cached_cast` keeps the cast of every
    /// trainable leaf weight in autocast's cache until the outermost region exits
    /// (`torch.autocast.__exit__` calls `torch.clear_autocast_cache()`), whatever autograd saved:
    /// in full fine-tuning with checkpointing every linear's copy is still cached while the loss
    /// is computed, and only once the region exits are the layers' copies dropped (backward then
    /// holds the head's, [`Self::autocast_weight_copies`]). A frozen weight (LoRA) is not cached,
    /// so with recomputation its cast dies with its layer's forward.
    fn autocast_copies_at_forward_end(&self, checkpointed: bool) -> f64 {
        let checkpointed_adapter = checkpointed && self.workload.is_adapter();
        let cached_adapters = if checkpointed_adapter {
            self.autocast_adapter_copies()
        } else {
            0.0
        };
        self.autocast_weight_copies(checkpointed_adapter) + cached_adapters
    }

    /// Autocast's 16-bit copies of the LoRA factors. PEFT keeps `lora_A` and `lora_B` in fp32
    /// (`autocast_adapter_dtype`) and they require grad, so `cached_cast`
    /// (`aten/src/ATen/autocast_mode.cpp`) caches each one's cast for the whole autocast
    /// region, and without recomputation each linear node also saves it for its input's
    /// gradient into backward; with checkpointing the recomputed layers cast their own.
    fn autocast_adapter_copies(&self) -> f64 {
        if self.dtype != Dtype::Fp16Amp || !self.workload.is_adapter() {
            return 0.0;
        }
        2.0 * self.adapter_params() * self.stage_share() / self.tp
    }

    /// Autocast's 16-bit copies of fp32 linear weights that backward still holds when it
    /// starts. Autocast caches the cast of every trainable leaf weight for the whole autocast
    /// region (`cached_cast` in `aten/src/ATen/autocast_mode.cpp`) and a frozen weight's cast is
    /// saved by its linear node for the input's gradient, so without recomputation every
    /// linear's copy is held into backward; with checkpointing the layers' copies are dropped
    /// at the end of forward and only the LM head's (saved outside any checkpoint) stays.
    fn autocast_weight_copies(&self, checkpointed: bool) -> f64 {
        if self.dtype != Dtype::Fp16Amp {
            return 0.0;
        }
        let head = f64::from(self.arch.vocab_size) * f64::from(self.arch.hidden_size);
        if checkpointed {
            return 2.0 * head;
        }
        // The input embedding is a lookup, not a linear: cast only when it is the tied head.
        let embedding = if self.arch.tied_embeddings { 0.0 } else { head };
        2.0 * (self.params - embedding).max(0.0) + self.autocast_adapter_copies()
    }

    /// The optimizer step's temporary: torch's `foreach` AdamW (`_multi_tensor_adamw`, the
    /// default on CUDA) takes `_foreach_sqrt` of every second moment into new tensors, one
    /// moment's worth; the fused kernel (`_fused_adamw_`) and SGD's momentum update in place.
    fn optimizer_step_temporary(&self) -> f64 {
        if self.optimizer != Optimizer::Adam || self.optimizer_fused {
            return 0.0;
        }
        let (_, _, states) = self.trainable_state();
        states / 2.0
    }

    fn precision(&self) -> Precision {
        match self.dtype {
            Dtype::Fp16Amp => Precision::Autocast,
            Dtype::Fp32 => Precision::Fp32,
            _ => Precision::Pure16,
        }
    }

    /// Compute width of activations: 16-bit for every dtype but fp32 (quantised weights are
    /// dequantised to 16 bits for their matmuls).
    fn compute_bytes(&self) -> f64 {
        if self.dtype == Dtype::Fp32 { 4.0 } else { 2.0 }
    }

    fn pass(&self, b: f64, s: f64) -> Pass {
        Pass {
            b,
            s,
            c: self.compute_bytes(),
            sdpa: self.sdpa,
            half: matches!(self.dtype, Dtype::Fp16 | Dtype::Fp16Amp),
        }
    }
}

/// The tensors at the peak of a pod that transformers' own modules run ([`hf`]).
///
/// Inference: the largest of the prefill (or an encoder's forward) and a decode step, over the
/// weights and the KV cache of the whole context. Encoder-decoders (Whisper): the encoder's
/// forward before any cache exists, or the first decoder step, which projects the encoder's
/// output into every layer's cross-attention cache.
///
/// Training: the largest of four moments of a step (gradients are freed by `zero_grad`, which
/// sets them to `None`, so they do not exist when backward starts):
/// 0. the forward ends, inside `torch.autocast`: every saved activation, every 16-bit weight
///    copy autocast's cache holds and the loss's forward tensors (`(c+8)·T·V`);
/// 1. backward starts: every saved activation (or each checkpointed layer's input), autocast's
///    16-bit weight copies still saved and the loss's three fp32 `T·V` tensors;
/// 2. backward ends: every gradient, one layer recomputed (or still saved) and its gradients;
/// 3. the optimizer step: every gradient and the step's temporary (`foreach` AdamW's
///    `_foreach_sqrt` of the second moment; none for the fused kernel or SGD).
pub(super) fn components(inp: &Inputs, tensor: &mut impl FnMut(&'static str, f64)) {
    let block = inp.block();
    if !inp.workload.is_training() {
        let seqs = inp.batch * inp.beams;
        let kv = inp.kv_cache(inp.tokens());
        let activations = match inp.kind {
            Kind::EncoderDecoder {
                encoder_positions, ..
            } => {
                let positions = if encoder_positions > 0 {
                    f64::from(encoder_positions)
                } else {
                    inp.context
                };
                seq2seq_activations(inp, &block, positions, kv)
            }
            Kind::Encoder => forward_peak(&block, &inp.pass(inp.batch, inp.context)),
            // The prefill runs over the prompt; the decode steps attend over the whole context.
            _ => forward_peak(&block, &inp.pass(seqs, inp.prompt)).max(decode_step(
                &block,
                &inp.pass(seqs, inp.context),
                inp.kv_bytes,
            )),
        };
        tensor("activations", activations);
        tensor("logits", generate_logits(&block, seqs, inp.compute_bytes()));
        tensor("kv-cache", kv);
        return;
    }
    let (grads, _, _) = inp.trainable_state();
    let prec = inp.precision();
    let pass = inp.pass(inp.batch, inp.context);
    let Saved { layer, kept, head } = inp.saved(&block, &pass);
    let checkpointed = inp.checkpointing == Checkpointing::Full;
    let cast = inp.autocast_weight_copies(checkpointed);
    // A window's boolean `b·s²` mask is built once per forward (`masking_utils.sdpa_mask`)
    // and every layer's attention, recomputed ones too, reads it until backward is done.
    let mask = if pass.sdpa && block.windowed(pass.s) {
        pass.b * pass.s * pass.s
    } else {
        0.0
    };
    let start = kept + head + cast + mask + loss_peak(&block, inp.tokens(), prec);
    // The end of the forward, inside autocast's region: every cached weight copy beside the
    // loss's forward tensors (checkpointed full fine-tuning under autocast is where this beats
    // `start`: the layers' copies outweigh the loss's gradients).
    let cached = inp.autocast_copies_at_forward_end(checkpointed);
    let loss_forward = loss_forward_end(&block, inp.tokens(), prec);
    let forward_end = kept + head + cached + mask + loss_forward;
    // Backward's late moments: with checkpointing, the top layer recomputed while every
    // layer's input is still kept, or the bottom one once every gradient exists; without it,
    // the bottom layer's backward beside every gradient.
    let late = if checkpointed { kept.max(grads) } else { grads };
    let end = late + mask + layer + backward_transient(&block, &pass, prec);
    let step = grads + inp.optimizer_step_temporary();
    if forward_end > start && forward_end >= end.max(step) {
        tensor("activations", kept + head + mask);
        tensor("autocast-weights", cached);
        tensor("logits", loss_forward);
    } else if start >= end.max(step) {
        tensor("activations", kept + head + mask);
        tensor("autocast-weights", cast);
        tensor("logits", loss_peak(&block, inp.tokens(), prec));
    } else if end >= step {
        tensor("gradients", grads.min(end));
        tensor("activations", end - grads.min(end));
    } else {
        tensor("gradients", grads);
        tensor("optimizer-step", step - grads);
    }
}

/// An encoder-decoder's activations at its allocated peak: the encoder's forward before any
/// cache exists, or the first decoder call, which holds the encoder's output while one layer's
/// cross-attention key and value are projected and copied into the cache (`WhisperAttention`:
/// `k_proj`, then `transpose(1, 2).contiguous()`, then the cache's `torch.cat`).
fn seq2seq_activations(inp: &Inputs, block: &Block, positions: f64, kv: f64) -> f64 {
    // The encoder runs once per input; `_expand_inputs_for_generation` then repeats its output
    // per beam, and the decoder's projections read the repeated one.
    let t_enc = inp.batch * inp.beams * positions;
    let encoder = forward_peak(block, &inp.pass(inp.batch, positions));
    let c = inp.compute_bytes();
    let first_step = t_enc * block.h * c + 2.0 * t_enc * block.kv * c;
    (encoder - kv).max(first_step)
}

/// Whisper's reserved memory beyond its allocated peak. `generate` runs three phases, and the
/// caching allocator serves each from the blocks the one before it freed
/// (`CUDACachingAllocator.cpp` `get_free_block`), so reserved is the largest of them, not the
/// allocated peak plus the encoder's stranded blocks:
///
/// 1. the encoder's forward (`WhisperEncoder.forward`), no cache yet: its activations and
///    `HF_SLACK_INFERENCE_TENSORS` stranded blocks of its largest tensor, as any forward;
/// 2. the first decoder call, which projects the encoder's output into every decoder layer's
///    cross-attention key and value (`WhisperAttention.forward`: `k_proj`, `v_proj`,
///    `transpose(1, 2).contiguous()`, `EncoderDecoderCache.cross_attention_cache.update`). These
///    `2·L` copies of `seqs·positions·kv` take the encoder's freed blocks first (every encoder
///    tensor is `positions` long, and one hidden wide or a multiple of it, so its blocks hold
///    whole copies) and fresh segments after: each copy costs at most its segment
///    (`get_allocation_size`: rounded to 2 MiB, or a share of a 20 MiB one under 10 MiB), and the
///    three more blocks of a copy's size are free after it: two from the call itself (per
///    layer `k_proj`'s output, the key's contiguous copy, `v_proj`'s output and the value's
///    contiguous copy, `v_proj`'s output freed before `DynamicLayer.update`'s `torch.cat`
///    reuses it, so the cache plus two: the layer's contiguous key and value, alive through
///    the update, then freed), and a third this model does not trace (an encoder block of the
///    same size, `seqs·positions·h·c`, is the likely one); three match the replay of
///    whisper-small b32 × 64 to the MiB (the test below);
/// 3. the decode: every step re-concatenates each layer's self-attention key and value one token
///    longer (`DynamicLayer.update`, `torch.cat`) while the old copy lives, and the freed copies
///    are one token short of the next, so the self-attention cache's blocks hold it twice; once
///    a copy is 10 MiB or more, the segments its 2 MiB crossings strand ([`seq2seq_crossings`]).
///    Beam search repeats the encoder's output per beam (`_expand_inputs_for_generation`) and
///    re-selects each cross-attention copy every step (`EncoderDecoderCache.reorder_cache`).
///
/// Taken for any encoder-decoder whose encoder output length is known (`encoder-positions`):
/// BART, T5 and `Speech2Text` run the same `generate` with an `EncoderDecoderCache`; only
/// Whisper's rows check it (`docs/oracle.md`, "Whisper's long decodes").
///
/// The oracle's replay of the H100 rows (`docs/oracle.md`, "Whisper's reserved"): whisper-small
/// at batch 64 reserved 2,432 MiB past the weights in the encoder, 1,566 MiB more in the first
/// decoder call (11 segments of 142 MiB; its 24 copies of 140.6 MiB went there and into the
/// encoder's freed blocks) and 24 MiB in the decode; the old count, two encoder MLP blocks on
/// top of the allocated peak, read it +25.7 %. The decode's relocation on whisper-large-v3
/// strands somewhat more than the one copy counted (2.35 `S` in all at batch 16, not 2).
fn seq2seq_slack(inp: &Inputs, block: &Block, positions: f64) -> f64 {
    let seqs = inp.batch * inp.beams;
    let c = inp.compute_bytes();
    let pass = inp.pass(inp.batch, positions);
    let kv = inp.kv_cache(inp.tokens());
    let logits = generate_logits(block, seqs, c);
    let allocated = seq2seq_activations(inp, block, positions, kv) + kv + logits;
    let copies = 2.0 * (block.layers / 2.0).max(1.0);
    // The cross-attention copies are `k_proj`/`v_proj` outputs, in the compute dtype whatever
    // the self-attention cache's dtype; `kv` counts them at `kv_bytes`, so the cross copies'
    // part of it is taken out at that width.
    let copy = seqs * positions * block.kv * c;
    let self_cache = (kv - copies * seqs * positions * block.kv * inp.kv_bytes).max(0.0);
    // `_expand_inputs_for_generation` repeats `encoder_outputs` once per beam.
    let output = seqs * positions * block.h * c;
    let cross = output + allocator::fresh(copies, allocator::block(copy)) + logits;
    let in_flight = allocator::fresh(3.0, allocator::block(copy));
    // Beam search's `EncoderDecoderCache.reorder_cache` re-selects every layer's
    // cross-attention key and value each step (`index_select`): one copy more in flight.
    let reorder = if inp.beams > 1.0 {
        allocator::block(copy)
    } else {
        0.0
    };
    let per_token = seqs * block.kv * inp.kv_bytes;
    let tokens = self_cache / (copies * per_token).max(1.0);
    let room = allocator::segment(allocator::block(copy));
    let crossings = seq2seq_crossings(copies, per_token, tokens, room);
    let phases = [
        forward_peak(block, &pass) + HF_SLACK_INFERENCE_TENSORS * stranding_tensor(block, &pass),
        cross + in_flight,
        cross + reorder + 2.0 * self_cache,
        cross + reorder + in_flight + crossings,
    ];
    (phases.into_iter().fold(0.0, f64::max) - allocated).max(0.0)
}

/// The segments Whisper's decode makes for its self-attention cache once a layer's key or
/// value is at least 10 MiB: every step `DynamicLayer.update` re-concatenates each of the
/// `copies` one token (`per_token` = `seqs·kv·c`) longer (`torch.cat`) while the old one lives,
/// and every `2 MiB / per_token` steps the copies outgrow the segments made for the previous
/// size (`get_allocation_size` rounds a block of 10 MiB or more up to 2 MiB), which no later,
/// larger copy fits: they are stranded ([`cache_crossings_fresh`]'s mechanism for decoders).
///
/// The only large free blocks beside them are the three the first decoder call leaves, each
/// a segment of `room` bytes (`seq2seq_slack`). At a crossing to size `X` each holds
/// `floor(room / X)` copies less the one its old copies need beside the new ones while
/// `torch.cat` runs; the other copies take segments of `X`, and one layer's key and value in
/// flight take two more. The decode runs to `tokens` (the cache's length at the last step).
///
/// The oracle's replay (`docs/oracle.md`, "Whisper's long decodes"): whisper-small fp16 at batch
/// 64 × 448 reserved 10,736 MiB where the count without the crossings read 6,077.
fn seq2seq_crossings(copies: f64, per_token: f64, tokens: f64, room: f64) -> f64 {
    let last = allocator::block((tokens - 1.0).max(0.0) * per_token);
    if !allocator::rounded_alone(last) {
        return 0.0;
    }
    // The first copy of 10 MiB or more (`kMinLargeAlloc`).
    let first = allocator::segment(allocator::block(
        (allocator::MIN_LARGE_ALLOC / per_token).ceil() * per_token,
    ));
    let mut total = 0.0;
    let mut size = first;
    while size <= allocator::segment(last) {
        let slots = 3.0 * (allocator::fits(room, size) - 1.0).max(0.0);
        total += (2.0 + (copies - slots).max(0.0)) * size;
        size += allocator::ROUND_LARGE;
    }
    total
}

/// What a decoder's `generate` without `prompt-tokens` assumes about its decode, for
/// `estimate`'s "assumed" lines: a prompt that fills the context, so the prefill is sized over
/// all of it and the decode runs one step (at most one 2 MiB level of the cache's growth is
/// counted past it). A shorter prompt and a longer generation can reserve more: each
/// `DynamicLayer.update` copy grows by `b·kv·c` bytes a step, so every `2 MiB / (b·kv·c)` steps it
/// outgrows the segment `get_allocation_size` rounded it into (`kRoundLarge`), and the caching
/// allocator keeps the outgrown segments (segments never merge or shrink), without bound until
/// `cudaMalloc` fails (the H200's Qwen3-0.6B at 32 × 1,024 + 1,024 reserved 59.4 GiB for 8.3
/// allocated; `tests/data/h200b`). The pod can state its prompt (the decode is then counted to
/// the context) or map its segments expandable (then nothing is stranded: said by
/// `expandable-segments`, and this line is not printed). A sliding-window cache shorter than the context
/// stops growing at the window (`DynamicSlidingWindowLayer`): nothing to say there.
pub(super) fn unstated_generation(inp: &Inputs) -> Option<String> {
    let decoder_generate = inp.kind == Kind::Decoder
        && !inp.workload.is_training()
        && inp.prompt >= inp.context
        && inp.hf_modules()
        && !inp.expandable_segments;
    if !decoder_generate || inp.block().windowed(inp.context) {
        return None;
    }
    Some(format!(
        "prompt-tokens unstated: a prompt of all {:.0} context tokens (the prefill sized over \
         it, the decode one step); a shorter prompt and a longer generation can reserve more, \
         each further {:.0} generated tokens growing every cache copy past another 2 MiB \
         segment size: state prompt-tokens, or run with \
         PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the webhook then sets \
         peakfit.io/expandable-segments)",
        inp.context,
        tokens_per_level(inp)
    ))
}

/// Decode steps per 2 MiB of growth of one cache copy (`b·kv·c` bytes a step).
fn tokens_per_level(inp: &Inputs) -> f64 {
    let a = &inp.arch;
    let per_step =
        inp.batch * inp.beams * f64::from(a.kv_heads) * f64::from(a.head_dim) * inp.kv_bytes;
    (allocator::ROUND_LARGE / per_step).ceil().max(1.0)
}

/// The loss's 16-bit segments: `lm_head`'s logits (`c·T·V`) and, under Gemma-2's soft-capping,
/// the division's output beside them (`logits / cap`; `tanh` and `* cap` reuse their blocks).
/// Nothing the loss allocates later is as small (its fp32 tensors are `4·T·V`), so backward
/// finds them free and cannot use them. None in fp32, where `logits.float()` is the logits
/// themselves (`ForCausalLMLoss`).
fn logits_segments(block: &Block, tokens: f64, prec: Precision) -> f64 {
    if prec == Precision::Fp32 {
        return 0.0;
    }
    let copies = if block.softcapped_logits() { 2.0 } else { 1.0 };
    copies * prec.c() * tokens * block.vocab
}

/// The blocks a training step's layers strand: `HF_SLACK_INFERENCE_TENSORS` of the forward's
/// stranding tensor ([`stranding_tensor`]: no fp32 score matrix, whose blocks come back whole),
/// or, for LoRA on 16-bit weights, one of each fp32 tensor PEFT's expression makes at the
/// widest adapted linear, `T·out·4` each: `lora_B`'s output (PEFT casts the input to the fp32
/// adapter), its `* scaling`, and the sum with the 16-bit base output, which promotes to fp32
/// before `.to(torch_result_dtype)` (`peft/tuners/lora/layer.py`, `Linear.forward`); each
/// recomputed layer's 16-bit tensors split the previous layer's. The count of three is what the
/// oracle's replay of the H200 rows of Phi-2, Phi-3-mini and Mistral-7B LoRA finds free at the
/// peak (3.0, 3.4 and 3.1 such blocks), not derived: the expression alone has at most two of them
/// alive at once (`lora_B`'s output is freed before the sum is made), so the third comes from
/// blocks the layers' recompute leaves that this count does not follow.
///
/// LoRA under autocast with checkpointing strands more in its forward than a forward's count:
/// each layer's fp32 output, kept as the next layer's checkpoint, splits a block the layer's
/// MLP freed, so the next layer's MLP takes fresh segments, up to a block per layer. Where
/// [`lora_replay`] follows the code ([`replayed_lora_forward`]) its replay of the forward adds
/// what it strands (Qwen3-4B at 8 × 2,048: 4.39 GiB, the oracle's 4.39) to the count. The
/// oracle's walk of those steps makes no large segment in backward past the loss's; the small
/// pool's segments are [`adapter_small_pool_slack`]'s. Without the count the steps read a little
/// under the oracle (Qwen3-4B at 8 × 2,048: 59.00 GiB for 59.26, at 4 × 2,048 37.68 for 37.87;
/// Llama-3.2-1B 8 × 2,048 36.00 for 36.13), from placements of the second step neither
/// follows, so it is kept, on the safe side: with it the whole step reads +0.1 to +2.6 % of
/// what the GPU or the oracle reserved on the thirteen workloads of the test
/// `autocast_loras_checkpointed_layers_strand_what_the_replay_finds`.
fn training_stranded(inp: &Inputs, block: &Block, pass: &Pass) -> f64 {
    let layers = HF_SLACK_INFERENCE_TENSORS * stranding_tensor(block, pass);
    if let Some(forward) = replayed_lora_forward(inp, block, pass) {
        return layers + forward;
    }
    if !(inp.workload.is_adapter() && inp.precision() == Precision::Pure16) {
        return layers;
    }
    let gate_up = if block.mlp == Mlp::FusedGated {
        2.0 * block.ffn
    } else {
        block.ffn
    };
    let qkv = if block.fused_qkv() {
        block.q + 2.0 * block.kv
    } else {
        block.q
    };
    layers.max(3.0 * 4.0 * pass.t() * gate_up.max(qkv).max(block.h))
}

/// What [`lora_replay`] finds a checkpointed LoRA forward under autocast strands, where it
/// follows the run's code: each layer's fp32 output, kept as the next layer's checkpoint,
/// splits a block the layer's MLP freed, and the next layer's MLP takes fresh segments. The
/// same layout conditions as [`replayed_training`]'s (not its optimizer's: a forward makes no
/// state), for LoRA (no dropout) under autocast with full checkpointing. The backward and the
/// second step are not replayed: [`training_stranded`] keeps its count on top. `model_type`s
/// that only share the Llama layout ([`prefill_replay::follows`]: Gemma v1, Cohere, Granite,
/// ...) get it too: neither the replay nor the count is their code, and adding the replay errs
/// on the safe side, as their prefills take the larger of the two.
fn replayed_lora_forward(inp: &Inputs, block: &Block, pass: &Pass) -> Option<f64> {
    let applies = inp.workload == Workload::Lora
        && inp.checkpointing == Checkpointing::Full
        && inp.precision() == Precision::Autocast
        && inp.lora_dropout <= 0.0
        && replays_llama_layout(inp, block, pass);
    if !applies {
        return None;
    }
    let d = llama_decoder(inp, block, pass);
    Some(lora_replay::replay(&d, inp.lora_rank).stranded())
}

/// The largest gradient or optimizer-state tensor a training step's first `optimizer.step()`
/// places after the first: `AdamW._init_group` creates each parameter's `exp_avg` and
/// `exp_avg_sq` (a tensor each) in parameter order, the embedding's first. So the tensors that
/// fill the loss's segments behind it are the layers' matrices (the MLP's `ffn·h`, the
/// attention's projections) and, last, an untied head's `V·h`; an adapter's are `r` by its
/// widest side. Each at the larger of the gradient's and one moment's bytes per element.
/// `grads` and `state` are the step's gradient and optimizer-state bytes
/// (`Inputs::trainable_state`), which the caller already holds.
fn largest_state_tensor(inp: &Inputs, block: &Block, grads: f64, state: f64) -> f64 {
    let layer_matrix = (block.ffn * block.h).max((block.q + 2.0 * block.kv) * block.h);
    let (params, widest) = if inp.workload.is_adapter() {
        let side = block.ffn.max(block.h).max(block.q + 2.0 * block.kv);
        (inp.adapter_params(), inp.lora_rank * side)
    } else if inp.arch.tied_embeddings {
        (inp.params, layer_matrix)
    } else {
        (inp.params, (block.vocab * block.h).max(layer_matrix))
    };
    if params <= 0.0 {
        return 0.0;
    }
    let moments = match inp.optimizer {
        Optimizer::Adam | Optimizer::Adam8bit => 2.0,
        Optimizer::Momentum => 1.0,
        Optimizer::Adafactor => 0.0,
    };
    let grad_bytes = grads / params;
    let moment_bytes = if moments > 0.0 && !inp.optimizer_paged {
        state / params / moments
    } else {
        0.0
    };
    widest * grad_bytes.max(moment_bytes)
}

/// What a training step reserves beyond its allocated peak `allocated`, from the caching
/// allocator's rules applied to the step's largest blocks (the oracle's replay of the measured
/// rows, docs/oracle.md "A training step's segments"):
/// 1. The first step's loss takes a segment per tensor, none fitting another's freed block:
///    the 16-bit logits ([`logits_segments`]), their fp32 copy, `log_softmax`'s output and,
///    in backward, `_log_softmax_backward_data`'s (the NLL gradient takes the copy's block).
///    The logits' segments stay free beside the fp32 ones; the layers strand blocks as a
///    forward does ([`training_stranded`]). The first step holds no optimizer state: its reserve is
///    `allocated − state + logits + stranded`.
/// 2. The first `optimizer.step()` creates the state while the gradients live, each tensor in
///    the smallest free block that holds it (`get_free_block`): first the layers' freed
///    segments (the checkpointed inputs or saved tensors, the head's, one layer's forward and
///    the stranded blocks), then the logits' segments, then the three fp32 `4·T·V` segments;
///    the embedding's and an untied head's gradient and state tensors (`V·h` each), larger
///    than any block the layers free, go straight to the loss's.
///    What the logits' segments hold of it is no longer slack at the later steps' peak. Every
///    fp32 segment that takes part of the state no longer holds a `4·T·V` block, so from the
///    second step the loss takes that many fresh segments (`ceil(spill / 4·T·V)`, at most
///    three; with all three taken, the logits' too), on top of the first step's reserve or of
///    the optimizer step's own peak (weights, gradients, state and foreach AdamW's temporary
///    list), whichever is larger.
/// 3. Under Gemma-2's soft-capping the saved `tanh` output (`c·T·V`) lives through the loss's
///    backward beside the three fp32 tensors. Where the state is more than one of its two logits
///    segments holds, neither is whole at step 2, so its logits split a whole fp32 segment and
///    the loss takes one fresh segment more (still at most three).
///
/// Where [`train_replay`] follows the run ([`replayed_training`]), its replay of the first two
/// steps replaces that count for the `model_type`s whose code it is
/// ([`prefill_replay::follows`]: the replay's large pool matches the oracle's allocator replay
/// of the same steps request for request, its reserve to within the small pool's few 2 MiB
/// segments, and the count misses which segments the first step's state pins); types that only
/// share the layout get the larger of the two, as their prefills do.
fn training_slack(inp: &Inputs, block: &Block, allocated: f64) -> f64 {
    let large = match replayed_training(inp, block) {
        Some(reserved) if inp.replayed_code => (reserved - allocated).max(0.0),
        Some(reserved) => counted_training_slack(inp, block, allocated).max(reserved - allocated),
        None => counted_training_slack(inp, block, allocated),
    };
    large + adapter_small_pool_slack(inp, block)
}

/// One layer's LoRA-adapted linears as (`in`, `out`) with PEFT's `all-linear` targets: the
/// attention's projections (one fused `qkv_proj` or `query_key_value` where the code fuses
/// them) and the MLP's (one fused `gate_up_proj` for Phi-3). Empty for a mixture of experts,
/// whose experts' adapters [`adapter_small_pool_slack`] does not follow.
fn adapted_linears(block: &Block) -> Vec<(f64, f64)> {
    if block.experts_per_token > 0.0 {
        return Vec::new();
    }
    let (h, q, kv, ffn) = (block.h, block.q, block.kv, block.ffn);
    let mut linears = if block.fused_qkv() {
        vec![(h, q + 2.0 * kv), (q, h)]
    } else {
        vec![(h, q), (h, kv), (h, kv), (q, h)]
    };
    linears.extend(match block.mlp {
        Mlp::FusedGated => vec![(h, 2.0 * ffn), (ffn, h)],
        Mlp::Gated => vec![(h, ffn), (h, ffn), (ffn, h)],
        Mlp::Plain => vec![(h, ffn), (ffn, h)],
    });
    linears
}

/// The small pool's segments a LoRA step leaves free at the next step's peak. PEFT keeps the
/// adapters in fp32 (`autocast_adapter_dtype`), so at ordinary ranks their `r·in` and `out·r`
/// matrices, gradients, AdamW moments and foreach's square roots are tensors of 1 MiB or less,
/// which the caching allocator serves from 2 MiB small-pool segments that no large request
/// uses and that are never released (`CUDACachingAllocator.cpp`, `kSmallSize`, `kSmallBuffer`).
/// Each generation comes while the earlier one lives, so each takes segments of its own:
/// backward's gradients (layers in reverse, `lora_B`'s before `lora_A`'s), the first
/// `optimizer.step()`'s moments (`exp_avg` then `exp_avg_sq` per parameter, `_init_group`) and,
/// for foreach AdamW, the list of square roots (`_foreach_sqrt`, freed after the step). At the
/// next step's peak, the loss's backward, only the moments live there; under autocast the
/// adapters' 16-bit casts, which autocast caches through each forward, come first and are
/// freed when the forward's autocast region ends, so the gradients reuse their blocks. The
/// rest of those segments is slack, less the small tensors a step without checkpointing saves
/// there ([`small_saved`]). `adamw` is torch's AdamW as it defaults on CUDA (foreach, with its
/// roots); HF Trainer's own default in transformers 5 is the fused kernel (`adamw_torch_fused`),
/// which a pod states as `optimizer: adamw-fused`. The oracle's walk of Llama-3.1-8B
/// LoRA rank 16 in bf16 at 4 × 2,048: the small pool grows 162 → 326 MiB in backward and to
/// 802 MiB in the optimizer step (gradients 160 MiB, moments 320, roots 160), none of it in
/// the count of the large pool's blocks. Replayed on the allocator's small pool
/// ([`prefill_replay`]'s heap) in that order; tensors over 1 MiB (high ranks on wide layers)
/// go to the large pool and are left out.
fn adapter_small_pool_slack(inp: &Inputs, block: &Block) -> f64 {
    static REPLAYS: prefill_replay::Memo<SmallPoolKey, f64> = std::sync::Mutex::new(Vec::new());
    if inp.workload != Workload::Lora || inp.optimizer != Optimizer::Adam || inp.optimizer_paged {
        return 0.0;
    }
    let key = SmallPoolKey {
        layers: crate::convert::f64_to_usize(block.layers),
        rank: inp.lora_rank.to_bits(),
        linears: adapted_linears(block)
            .into_iter()
            .map(|(i, o)| (i.to_bits(), o.to_bits()))
            .collect(),
        autocast: inp.precision() == Precision::Autocast,
        roots: !inp.optimizer_fused,
    };
    let free = prefill_replay::memoized(&REPLAYS, key.clone(), || small_pool_replay(&key));
    (free - small_saved(inp, block)).max(0.0)
}

/// The small tensors the next step's forward saves for backward without checkpointing, alive
/// at its peak in the gradients' and roots' freed small blocks (already counted as allocated):
/// each adapted linear's `lora_A` output (`T·r`, fp32 on 16-bit weights, the compute width
/// under autocast) and, under autocast, the adapters' 16-bit casts, which backward needs too.
/// With checkpointing the peak, the loss's backward, comes before any layer is recomputed.
fn small_saved(inp: &Inputs, block: &Block) -> f64 {
    if inp.checkpointing != Checkpointing::None {
        return 0.0;
    }
    let prec = inp.precision();
    let width = if prec == Precision::Autocast {
        prec.c()
    } else {
        4.0
    };
    let a_out = width * inp.tokens() * inp.lora_rank;
    let linears = adapted_linears(block);
    let mut saved = 0.0;
    if allocator::small(allocator::block(a_out)) {
        saved += a_out * linears.len() as f64 * block.layers;
    }
    if prec == Precision::Autocast {
        let r = inp.lora_rank;
        let casts: f64 = linears
            .iter()
            .flat_map(|&(i, o)| [2.0 * r * i, 2.0 * o * r])
            .filter(|&b| allocator::small(allocator::block(b)))
            .sum();
        saved += casts * block.layers;
    }
    saved
}

/// The shape [`adapter_small_pool_slack`] replays, as its memo's key.
#[derive(Clone, Debug, PartialEq)]
struct SmallPoolKey {
    layers: usize,
    /// `f64::to_bits` of the rank, and of each adapted linear's `in` and `out`.
    rank: u64,
    linears: Vec<(u64, u64)>,
    autocast: bool,
    /// Foreach AdamW's square roots (not the fused kernel).
    roots: bool,
}

fn small_pool_replay(key: &SmallPoolKey) -> f64 {
    let r = f64::from_bits(key.rank);
    let layers = key.layers;
    let linears: Vec<(f64, f64)> = key
        .linears
        .iter()
        .map(|&(i, o)| (f64::from_bits(i), f64::from_bits(o)))
        .collect();
    // Every adapter matrix in `parameters()` order, elements: `lora_A` (`r·in`), `lora_B`
    // (`out·r`).
    let params: Vec<f64> = (0..layers)
        .flat_map(|_| linears.iter().flat_map(|&(i, o)| [r * i, o * r]))
        .collect();
    let small = |bytes: f64| allocator::small(allocator::block(bytes));
    let mut heap = prefill_replay::Heap::<prefill_replay::SizeClasses>::default();
    let mut live = 0.0;
    if key.autocast {
        let casts: Vec<_> = params
            .iter()
            .filter(|&&n| small(2.0 * n))
            .map(|&n| heap.malloc(2.0 * n))
            .collect();
        for c in casts {
            heap.free(c);
        }
    }
    let grads: Vec<_> = params
        .iter()
        .rev()
        .filter(|&&n| small(4.0 * n))
        .map(|&n| heap.malloc(4.0 * n))
        .collect();
    for &n in params.iter().filter(|&&n| small(4.0 * n)) {
        heap.malloc(4.0 * n);
        heap.malloc(4.0 * n);
        live += 8.0 * n;
    }
    if key.roots {
        let roots: Vec<_> = params
            .iter()
            .filter(|&&n| small(4.0 * n))
            .map(|&n| heap.malloc(4.0 * n))
            .collect();
        for h in roots.into_iter().rev() {
            heap.free(h);
        }
    }
    for g in grads {
        heap.free(g);
    }
    (heap.reserved() - live).max(0.0)
}

/// The layout [`train_replay`] and [`lora_replay`] follow, as `pass` runs it: a decoder in
/// transformers' Llama code (Qwen3's per-head norms included) with a gated dense MLP, SDPA's
/// fused kernels without a mask, and the caching allocator's ordinary segments.
fn replays_llama_layout(inp: &Inputs, block: &Block, pass: &Pass) -> bool {
    let head_dim = if block.heads > 0.0 {
        block.q / block.heads
    } else {
        0.0
    };
    inp.kind == Kind::Decoder
        && matches!(block.family, ModelType::Llama | ModelType::QkNorm)
        && block.mlp == Mlp::Gated
        && block.experts_per_token <= 0.0
        && pass.sdpa
        && !pass.math_kernel(block)
        && !block.sdpa_mask(pass)
        // transformers skips the sliding-window mask only while the keys are fewer than the
        // window (`masking_utils.sliding_window_causal_mask`'s `kv_length <
        // local_attention_size`): at a context equal to it the mask is made, which the replays
        // do not follow.
        && !(block.sliding_window > 0.0 && inp.context >= block.sliding_window)
        // cuDNN's and flash's kernels take head dims that are multiples of 8 up to 256; past
        // that SDPA runs another kernel, whose requests the replays do not follow.
        && head_dim <= 256.0
        && head_dim % 8.0 == 0.0
        // Expandable segments map pages instead of stranding segments of an old size.
        && !inp.expandable_segments
        && block.heads > 0.0
}

/// What [`train_replay`] reserves over a full fine-tune's first two steps, where it follows the
/// run's code: transformers' Llama layout (`modeling_llama.py`; Qwen2 and Mistral run the same,
/// Qwen3 adds its per-head norms), a gated dense MLP, SDPA's fused kernels, no sliding window
/// inside the context, weights and state in the compute dtype (`bf16`/`fp16`, no autocast),
/// no checkpointing, one GPU, and AdamW (foreach or fused, in the caching allocator: not paged
/// or 8-bit).
fn replayed_training(inp: &Inputs, block: &Block) -> Option<f64> {
    let pass = inp.pass(inp.batch, inp.context);
    let applies = inp.workload.is_training()
        && !inp.workload.is_adapter()
        && inp.checkpointing == Checkpointing::None
        && inp.precision() == Precision::Pure16
        && matches!(inp.dtype, Dtype::Bf16 | Dtype::Fp16)
        && inp.optimizer == Optimizer::Adam
        && !inp.optimizer_paged
        && replays_llama_layout(inp, block, &pass);
    if !applies {
        return None;
    }
    let d = llama_decoder(inp, block, &pass);
    let adam = if inp.optimizer_fused {
        train_replay::Adam::Fused
    } else {
        train_replay::Adam::Foreach
    };
    Some(train_replay::replay(&d, adam, inp.qkv_bias))
}

/// [`training_slack`]'s count from the step's largest blocks, for every training step the
/// replay does not follow.
fn counted_training_slack(inp: &Inputs, block: &Block, allocated: f64) -> f64 {
    let prec = inp.precision();
    let pass = inp.pass(inp.batch, inp.context);
    let tokens = inp.tokens();
    let fp32 = loss_tensor(block, tokens);
    let logits = logits_segments(block, tokens, prec);
    let stranded = training_stranded(inp, block, &pass);
    let (grads, _, state) = inp.trainable_state();
    // A paged optimizer's state lives in unified memory outside the caching allocator
    // (`cudaMallocManaged`): it is not in `allocated`, takes no freed block and no segment.
    let state = if inp.optimizer_paged { 0.0 } else { state };
    let first = allocated - state + logits + stranded;
    let saved = inp.saved(block, &pass);
    let room = saved.kept + saved.head + forward_peak(block, &pass) + stranded;
    // The vocabulary matrices' gradients and state, each tensor larger than any block the
    // layers free, fit nowhere but the loss's segments.
    let vocab_gradient = block.vocab * block.h * grads / inp.params;
    let vocab_share = if inp.workload.is_adapter() || vocab_gradient <= largest_tensor(block, &pass)
    {
        0.0
    } else {
        (grads + state) * inp.embedding_params() / inp.params
    };
    let spill = (grads + state - room).max(vocab_share);
    // Fp32 segments the state takes, or, where the first step's reserve is short of the later
    // steps' peak, the loss's tensors (the last it allocates) take fresh in `4·T·V` blocks.
    // The state comes tensor by tensor, each into the smallest free block that holds it
    // (`get_free_block`): a segment the next tensor does not fit has less than that tensor
    // left free, so each segment holds at least its size less the largest such tensor
    // ([`largest_state_tensor`]). Counting at that fill, not a perfect one, keeps the count
    // from falling a whole segment short where the state nearly fills the segments.
    let one = largest_state_tensor(inp, block, grads, state);
    let displaced = if spill > (logits - one).max(0.0) {
        let held = fp32 - one;
        if held <= 0.0 {
            3.0
        } else {
            ((spill - (logits - one).max(0.0)) / held).ceil()
        }
    } else {
        0.0
    };
    let short = ((allocated + stranded - first) / fp32).ceil().max(0.0);
    let pinned = displaced.max(short).min(3.0);
    // Gemma-2's soft-capped logits save `tanh`'s output (`c·T·V`, one of its two logits segments)
    // for backward, where it is alive beside the loss's three fp32 tensors (`log_softmax`'s output,
    // the NLL gradient and `_log_softmax_backward_data`'s). Where the first step's state is more
    // than one logits segment holds, both hold some, and step 2's forward finds neither whole: its
    // two 16-bit logits split a whole fp32 segment, and the saved one keeps it through backward, so
    // the loss's fp32 tensors take one more fresh segment, whether the others went to the state or
    // to a first step's reserve short of the later peak (`short`). Never past three: with every
    // fp32 segment taken the logits take fresh ones of their own (`logits_again`) and this block
    // goes with them. Other decoders' 16-bit logits are freed before backward, so the block they
    // borrow in forward is the NLL gradient's again.
    // One of Gemma-2's two logits segments ([`logits_segments`]): `lm_head`'s output or
    // `logits / cap`, each `c·T·V`.
    let one_logits_segment = prec.c() * tokens * block.vocab;
    let saved_logits_moved = if block.softcapped_logits()
        && spill > (one_logits_segment - one).max(0.0)
        && pinned < 3.0
        && logits > 0.0
    {
        1.0
    } else {
        0.0
    };
    let taken = (pinned + saved_logits_moved).min(3.0);
    let reserved = if taken > 0.0 {
        let temporary = if inp.optimizer_paged {
            0.0
        } else {
            inp.optimizer_step_temporary()
        };
        let step = inp.weights() + grads + state + temporary;
        let logits_again = if pinned >= 3.0 { logits } else { 0.0 };
        (first.max(step) + taken * fp32 + logits_again).max(allocated + stranded)
    } else {
        // The state fits before the fp32 segments: the logits' segments hold the part of it
        // the layers' blocks did not, and stay free for the rest.
        first.max(allocated + logits + stranded - spill.max(0.0))
    };
    (reserved - allocated).max(0.0)
}

/// The caching allocator's slack under transformers' own modules: for the decoders
/// [`prefill_replay`] follows, what its replay of the run leaves (reserved − the allocated
/// peak, plus the decode's fresh segments); a training step's segments ([`training_slack`]);
/// elsewhere `HF_SLACK_INFERENCE_TENSORS` stranded tensors and the decode terms. `allocated` is
/// the estimate's allocated peak.
pub(super) fn slack(inp: &Inputs, allocated: f64) -> f64 {
    let block = inp.block();
    if inp.workload.is_training() {
        return training_slack(inp, &block, allocated);
    }
    let pass = match inp.kind {
        Kind::EncoderDecoder {
            encoder_positions, ..
        } if encoder_positions > 0 => {
            return seq2seq_slack(inp, &block, f64::from(encoder_positions));
        }
        Kind::Encoder | Kind::EncoderDecoder { .. } => inp.pass(inp.batch, inp.context),
        _ => {
            let seqs = inp.batch * inp.beams;
            let prefill = inp.pass(seqs, inp.prompt);
            let largest = largest_tensor(&block, &prefill);
            let stranding = stranding_tensor(&block, &prefill);
            let decode = decode_step(&block, &inp.pass(seqs, inp.context), inp.kv_bytes);
            // A prompt shorter than the context states how far the decode runs; the default
            // (the prompt filling the context) does not.
            let end = (inp.prompt < inp.context).then_some(inp.context);
            // Llama-layout code the replay does not follow (Gemma v1, Cohere, Granite, a pod
            // stating no `model-type`, ...): neither the replay of the Llama layout nor the
            // analytic count is its code, so it gets the larger (`prefill_replay::follows`).
            let mut floor = 0.0;
            if let Some(d) = replayed_decoder(inp, &block, &prefill) {
                // The replay runs the decode until it stops making segments, short of the first
                // 2 MiB crossing; the growth after it is counted below.
                // The replay's decode segments depend on where each copy lands, which is not
                // monotone in the prompt (Qwen3-0.6B at 32 × 8,192 makes 17 × 510 MiB of them at
                // 8,128 and 8,192 tokens and none at 8,191): a pod's prompts vary up to the
                // stated one, so step 1 is never counted below the closed form's count
                // ([`cache_relocation_fresh`], the rule before the replay).
                let counted = cache_relocation_fresh(&block, &prefill, inp.kv_bytes, stranding);
                // The copies outgrow the prefill's room later in a long generation:
                // [`prefill_replay::Replayed::outgrown_fresh`] counts that from the replay's own
                // layout, up to the stated context, or one 2 MiB level of growth past the replay
                // without `prompt-tokens` (as [`cache_crossings_fresh`] counts one crossing).
                // Where step 1 made segments the later growth is the larger of that and two
                // segments per crossing ([`cache_crossings_fresh`], the 8k trace's count, whose
                // prefill's blocks hold every copy): a short prompt's blocks hold few of copies
                // that double (`tests/data/h200b`'s Qwen3-0.6B at 32 × 1,024 + 1,024).
                let replayed = |d: &prefill_replay::Decoder, r: prefill_replay::Replayed| {
                    // A sliding-window cache the prompt fills keeps `window - 1` tokens, so
                    // every decode step's copies (`window` tokens) fit where the last step's
                    // were (`DynamicSlidingWindowLayer.update`): nothing grows past the steps
                    // the replay ran.
                    // Step 1 is still never counted below the closed form: the pod's real
                    // prompts may be shorter than the window.
                    if d.window.is_some_and(|w| d.s >= w - 1.0) {
                        return r.prefill_slack
                            + r.decode_fresh.max(counted)
                            + eager_unreplayed_segment(d);
                    }
                    let step_one = r.decode_fresh.max(counted);
                    let per_token = d.b * d.kv * d.c;
                    let last =
                        end.map_or(r.tokens + allocator::ROUND_LARGE / per_token, |e| e - 1.0);
                    let outgrown = r.outgrown_fresh(d, last);
                    let later = if step_one > 0.0 {
                        cache_crossings_fresh(&block, &prefill, inp.kv_bytes, end, step_one)
                            .max(outgrown)
                    } else {
                        outgrown
                    };
                    // Falcon's math kernel copies k and v to every head in each decode step;
                    // those copies grow with the cache, `4·heads/c` times faster (142 in 16 bits).
                    let per_token = 4.0 * d.b * d.heads * d.head_dim;
                    let math_last =
                        end.map_or(r.tokens + allocator::ROUND_LARGE / per_token, |e| e - 1.0);
                    r.prefill_slack
                        + step_one
                        + later
                        + r.math_copies_fresh(d, math_last)
                        + eager_unreplayed_segment(d)
                };
                // The replay is exact for the prompt it is given, and not monotone in it: a
                // cache copy a token longer or shorter lands in another block. Without
                // `prompt-tokens` the prefill is sized over the whole context, a length no
                // real prompt has (`generate` makes at least one token), and whose tensors can
                // all be whole powers of two: Qwen2.5-0.5B at 1 × 32,768 strands 219 MiB
                // there, 411 MiB at 32,767 and at the oracle's prompt of 32,704, while
                // Qwen3-0.6B at 32 × 8,192 makes its decode segments at 8,192 and 8,128 and
                // not at 8,191. So the larger of the two ends is taken.
                // (Both replays start from one heap of weights: `prefill_replay::replay_pair`.)
                let replay = if inp.prompt < inp.context || d.s < 2.0 {
                    replayed(&d, prefill_replay::replay(&d))
                } else {
                    let longest = prefill_replay::Decoder { s: d.s - 1.0, ..d };
                    let (at_context, at_longest) = prefill_replay::replay_pair(&d, longest.s);
                    replayed(&d, at_context).max(replayed(&longest, at_longest))
                };
                if inp.replayed_code {
                    return replay;
                }
                floor = replay;
            }
            let relocation = if inp.legacy_cache {
                // The legacy cache is counted twice over already (`kv_cache`).
                0.0
            } else {
                let fresh = cache_relocation_fresh(&block, &prefill, inp.kv_bytes, stranding);
                fresh + cache_crossings_fresh(&block, &prefill, inp.kv_bytes, end, fresh)
            };
            return (HF_SLACK_INFERENCE_TENSORS * stranding
                + gathered_experts_fresh(&block, &prefill, seqs, decode, largest)
                + relocation)
                .max(floor);
        }
    };
    HF_SLACK_INFERENCE_TENSORS * stranding_tensor(&block, &pass)
}

/// The prefill [`prefill_replay`] replays request by request, where its sequence is the one
/// that module follows: a decoder of Llama's code (Qwen3's q/k norms included) with a dense
/// gated MLP, run by SDPA's fused kernels without a mask (no score matrix, no window shorter
/// than the context), one sequence per prompt (beam search reorders the cache with copies of
/// its own), a `DynamicCache` in the compute dtype; or Falcon-7B's layout under SDPA (one kv
/// head, so SDPA's math kernel with a mask, `prefill_replay::falcon`); or Phi-3 under bf16 or
/// fp16 eager attention (`prefill_replay::phi3`; fp16's softmax road is `prefill_replay::eager`'s
/// half-to-float one, checked on Llama's layer; fp32's keeps the count). Everything else keeps
/// the count of stranded tensors.
fn replayed_decoder(
    inp: &Inputs,
    block: &Block,
    prefill: &Pass,
) -> Option<prefill_replay::Decoder> {
    let llama = matches!(block.family, ModelType::Llama | ModelType::QkNorm)
        && block.mlp == Mlp::Gated
        && block.experts_per_token <= 0.0;
    let fused = prefill.sdpa
        && !prefill.math_kernel(block)
        && !block.sdpa_mask(prefill)
        && !block.windowed(inp.context);
    // Falcon with one kv head (`multi_query` without `new_decoder_architecture`: the
    // annotations carry no `parallel_attn` or `alibi`, and every published multi-query Falcon,
    // falcon-7b and its instruct tune, runs attention beside the MLP with rotary positions) under
    // SDPA: `prefill_replay::falcon`'s layer.
    let falcon = block.family == ModelType::Falcon
        && block.mlp == Mlp::Plain
        && block.experts_per_token <= 0.0
        && prefill.sdpa
        && block.kv < block.q
        && (block.kv * block.heads - block.q).abs() < f64::EPSILON
        && (block.h - block.q).abs() < f64::EPSILON;
    // Phi-3 (Phi-3-mini: a kv head per head) under 16-bit eager attention: its own layer, its
    // sliding window's mask and cache followed (`prefill_replay::phi3`).
    let phi3 = block.family == ModelType::Phi3
        && block.mlp == Mlp::FusedGated
        && block.experts_per_token <= 0.0;
    // Eager attention as `prefill_replay::eager` follows it: every head its own kv head (no
    // `repeat_kv` copies) and no window (`eager_mask` then masks the window too) but Phi-3's.
    let eager = (!prefill.sdpa
        && (block.kv - block.q).abs() < f64::EPSILON
        && (phi3 || !block.windowed(inp.context)))
    .then_some(if prefill.c >= 4.0 {
        prefill_replay::Softmax::Fp32
    } else if prefill.half {
        prefill_replay::Softmax::HalfToFloat
    } else {
        prefill_replay::Softmax::Copy
    });
    // Weights stored in the compute dtype: the replay builds them as the run does.
    let plain = matches!(inp.dtype, Dtype::Bf16 | Dtype::Fp16 | Dtype::Fp32)
        && inp.kind == Kind::Decoder
        && inp.beams <= 1.0
        && !inp.legacy_cache
        && (inp.kv_bytes - prefill.c).abs() < f64::EPSILON;
    ((llama && (fused || eager.is_some())
        || falcon
        || phi3
            && matches!(
                eager,
                Some(prefill_replay::Softmax::Copy | prefill_replay::Softmax::HalfToFloat)
            ))
        && plain
        && block.heads > 0.0)
        .then(|| prefill_replay::Decoder {
            eager: eager.filter(|_| !falcon),
            layer: if falcon {
                prefill_replay::Layer::Falcon
            } else if phi3 {
                prefill_replay::Layer::Phi3
            } else {
                prefill_replay::Layer::Llama
            },
            window: (phi3 && block.sliding_window > 0.0).then_some(block.sliding_window),
            ..llama_decoder(inp, block, prefill)
        })
}

/// `block`'s shape as [`prefill_replay`] and [`train_replay`] run it, `pass`'s sequences and
/// width, under the Llama layout with SDPA's fused kernels and no window.
fn llama_decoder(inp: &Inputs, block: &Block, pass: &Pass) -> prefill_replay::Decoder {
    prefill_replay::Decoder {
        b: pass.b,
        s: pass.s,
        c: pass.c,
        h: block.h,
        q: block.q,
        kv: block.kv,
        heads: block.heads,
        head_dim: block.q / block.heads,
        ffn: block.ffn,
        vocab: block.vocab,
        layers: crate::convert::f64_to_usize(block.layers),
        qk_norm: block.qk_norm(),
        tied: inp.arch.tied_embeddings,
        eager: None,
        layer: prefill_replay::Layer::Llama,
        window: None,
    }
}

/// One segment of an eager prefill's largest score request (`4·b·heads·s²`, the fp32 softmax)
/// beyond what [`prefill_replay`] replays. The replay reproduces the oracle's allocator replay
/// of the same run to 0.02 MiB (SmolLM2-1.7B eager at 16 × 1,984: 6,500.71 MiB of slack against
/// 6,500.73), and the oracle is exact on both Phi-3-mini eager H100 rows, but on the H100 the
/// `SmolLM2` rows reserved one score segment more than that replay: 7,688 MiB (one `4·n` block) in
/// bf16 and 3,844 MiB (one `c·n` block) in fp16 (`docs/oracle.md`, "Eager attention's reserved
/// memory"). Which free segment the cache's copies and the MLP carve between layers decides
/// whether a later layer's scores need a fresh one, and the GPU's order differs from the fake
/// tensors' somewhere the oracle does not see; under-counting a segment of this size OOM-kills a
/// neighbour, so the larger of the two is counted. SDPA's fused kernels make no score matrix and
/// count nothing here.
fn eager_unreplayed_segment(d: &prefill_replay::Decoder) -> f64 {
    if d.eager.is_none() {
        return 0.0;
    }
    allocator::segment(allocator::block(4.0 * d.b * d.heads * d.s * d.s))
}

/// The blocks a prefill leaves free for the decode, at least: one layer's MLP intermediates
/// and its `RMSNorm`'s two fp32 copies, each alive beside the others of its phase and so each a
/// block of its own, freed at the end of every layer (the attention phase's smaller tensors
/// may be carved out of these, so they are not counted again). A mixture of experts' routed
/// copies are left out: fewer blocks is the safe side of [`cache_relocation_fresh`].
fn prefill_free_blocks(block: &Block, p: &Pass) -> Vec<f64> {
    let t = p.t();
    let i = t * block.ffn * p.c;
    let mut blocks = match block.mlp {
        _ if block.experts_per_token > 0.0 => Vec::new(),
        Mlp::Gated => vec![i; 3],
        // The `2I` output, whose chunks are views, beside `act(gate)` and the product.
        Mlp::FusedGated => vec![2.0 * i, i, i],
        Mlp::Plain if block.composed_gelu() => vec![i; 4],
        Mlp::Plain => vec![i; 2],
    };
    if block.rms() {
        blocks.extend([4.0 * t * block.h; 2]);
    }
    blocks
}

/// Fresh segments at the first decode step of `generate`, when every layer's key and value
/// outgrow the blocks they were built in. `DynamicLayer.update` (transformers
/// `cache_utils.py`) replaces each layer's key, then its value, by `torch.cat([old, new],
/// dim=-2)`: a request one token (`b·kv·c`) larger than the block it replaces, made while that
/// block is still live. The caching allocator (`allocator`) serves it from the smallest
/// free block that holds it (`get_free_block`); the old block, freed after, is too small by
/// that token for the next one. A layer's key and value were built back to back in the prefill,
/// so they sit side by side; once both are freed they merge (`try_merge_blocks`) into one
/// block that holds the next layer's key. That leaves one request per layer (its value) to the
/// blocks the prefill freed (`prefill_free_blocks`, each holding as many as whole requests
/// fit: a block of exactly three old keys holds two new ones) and the rest to fresh segments
/// of its size rounded up to 2 MiB (`get_allocation_size`). Those segments sit on top of the
/// prefill's reserved memory, which nothing else in the decode needs.
///
/// Traced on the allocator replay (`docs/oracle.md`, "Why the model reads low on three rows"):
/// Qwen3-0.6B at batch 32 × 8,128 put 30 of step 1's 56 copies in merged old blocks, 11 in the
/// prefill's free blocks and the rest in 510 MiB segments, +12.0 GiB over the decode; the H100
/// measured +10.0 GiB, and an H200 trace of the same shape at 7,936 + 256 made 14 segments of
/// 498 MiB at step 1 (`tools/measure/decode-trace`). Later steps outgrow the 2 MiB rounding
/// again (every `2 MiB / (b·kv·c)` steps): [`cache_crossings_fresh`].
fn cache_relocation_fresh(block: &Block, prefill: &Pass, kv_bytes: f64, stranding: f64) -> f64 {
    let token = prefill.b * block.kv * kv_bytes;
    let grown = allocator::block(prefill.b * prefill.s * block.kv * kv_bytes + token);
    if allocator::small(grown) {
        // Small-pool copies (`get_pool`: at most 1 MiB; the large pool's blocks never serve
        // them): a layer's key and value share a 2 MiB segment, and once both are freed it is
        // whole again (`try_merge_blocks`) and holds the next layer's two copies, so only the
        // first layer's need a segment of their own. The replays of SmolLM2-135M and
        // Llama-3.1-8B at 1 × 448 + 64 new tokens made one small segment in decode, and
        // Llama two more once its copies reached 1 MiB.
        return allocator::fresh(1.0, grown);
    }
    // The prefill's own slack, `HF_SLACK_INFERENCE_TENSORS` blocks of its
    // [`stranding_tensor`], is free room too.
    let stranded = HF_SLACK_INFERENCE_TENSORS * allocator::fits(allocator::block(stranding), grown);
    let slots: f64 = prefill_free_blocks(block, prefill)
        .into_iter()
        .map(|b| allocator::fits(allocator::block(b), grown))
        .sum::<f64>()
        + stranded;
    allocator::fresh(block.layers - slots, grown)
}

/// Fresh segments at the later 2 MiB crossings of a long generation: every
/// `2 MiB / (b·kv·c)` decode steps each layer's key and value outgrow the segments made for the
/// previous size (`get_allocation_size` rounds a request of 10 MiB or more up to 2 MiB, and one
/// that fits no cached block gets a segment of its own). Segments never merge and every later
/// copy is larger, so the outgrown ones are stranded: reserved grows by the new segments at
/// each crossing and never shrinks. Only a cache that did not fit the prefill's blocks at step 1
/// (`step_one` > 0 from [`cache_relocation_fresh`]) has copies living alone in such segments;
/// the copies inside the prefill's large blocks move into each other's merged holes
/// (`try_merge_blocks`) and need none.
///
/// Per crossing, one layer's key and value take segments of the new size: the copies in the
/// prefill's large blocks hold `floor(B / S)` of them (a 1,984 MiB block three of 496–661 MiB)
/// with no whole free copy left over, and `DynamicLayer.update` re-concatenates the pair while
/// its old blocks are live, exact-size holes that hold no larger copy until a neighbour is
/// freed. Traced on an H200 (2026-11-27, `torch.cuda.memory_snapshot()` per decode step,
/// `docs/oracle.md`, "Decode past the first step"): Qwen3-0.6B bf16 at batch 32 × 7,936 + 256
/// new tokens made 3 segments of 500 MiB at step 33, then exactly 2 at each crossing after
/// (502, 504, … 512 MiB at steps 65, 97, … 225); at batch 16 × 7,680 + 512 new, 3 of 244 MiB,
/// then 2 of 246 … 256 MiB. Two is the count for a prefill whose segments hold every copy (the
/// GPU's: sixteen 1,984, three 1,488 and two 992 MiB segments, 56 copies of 498–661 MiB for 28
/// layers); the oracle's replay leaves ten 1,984 and ten 1,488 MiB ones, room for 52, and makes
/// `2 + (56 − 52)` = 6 per crossing. The segment counts of a prefill are not in the model.
///
/// With a stated prompt the crossings counted are its cache growing to the context's
/// (`end − 1` tokens at the last forward, `end` the context). The default annotations state no
/// generation length (`end` is `None`: the prompt fills the context), and a generation of more
/// than `2 MiB / (b·kv·c)` tokens (32 at batch 32 of Qwen3-0.6B) reaches the first crossing, so
/// one is counted: a pod that generates longer should state its prompt, and reads low without it.
/// Copies under 10 MiB share 20 MiB segments (`kLargeBuffer`) and are not followed.
///
/// Copies that outgrow the prefill's freed blocks in a long generation are not this term's:
/// where the replay runs, its own layout counts them ([`prefill_replay::Replayed::outgrown_fresh`];
/// Llama-3.1-8B at batch 4 × 2,048 + 6,144 new tokens makes 19.3 GiB of segments past step 1 when
/// every step is replayed), and [`slack`] takes the larger of the two. Not counted yet, and low
/// where it happens: the same on models the replay does not follow, whose prefills' blocks may
/// hold fewer copies than all `2L` after step 1 and then make more than two segments per
/// crossing.
fn cache_crossings_fresh(
    block: &Block,
    prefill: &Pass,
    kv_bytes: f64,
    end: Option<f64>,
    step_one: f64,
) -> f64 {
    let per_token = prefill.b * block.kv * kv_bytes;
    let first = allocator::block(prefill.s * per_token + per_token);
    if step_one <= 0.0 || !allocator::rounded_alone(first) {
        return 0.0;
    }
    let from = allocator::segment(first);
    let crossings = match end {
        Some(end) => {
            let last = allocator::block((end - 1.0).max(prefill.s + 1.0) * per_token);
            ((allocator::segment(last) - from) / allocator::ROUND_LARGE)
                .round()
                .max(0.0)
        }
        None => 1.0,
    };
    // Two segments per crossing, of `from + 2 MiB`, `from + 4 MiB`, … `from + crossings·2 MiB`.
    2.0 * (crossings * from + allocator::ROUND_LARGE * crossings * (crossings + 1.0) / 2.0)
}

/// Reserved bytes a mixture of experts adds at its first decode step beyond what the allocated
/// peak already counts: the gathered gate/up (`b·k·2·I·h·c`) and down (`b·k·I·h·c`) weights of
/// `batched_mm_experts_forward` ([`decode_step`]) that are larger than any block the prefill
/// freed (at most its largest tensor) get segments of their own. The caching allocator serves
/// a request from the smallest cached block that holds it and makes a new segment when none
/// does (`CUDACachingAllocator.cpp`: `get_free_block`, then `alloc_block`), and it never
/// releases the prefill's segments, so those gathers sit on top of the prefill's reserved
/// memory: reserved = weights + cache + prefill activations `P` + the prefill's slack + fresh,
/// while allocated counts `max(P, D)` (`D` the decode step's activations). The difference
/// beyond the prefill's slack is `P + fresh − max(P, D)`, never below 0; a dense model gathers
/// nothing. Traced on the allocator replay: Qwen3-30B-A3B at batch 256 × 512 made 12,288 and
/// 6,144 MiB segments in decode step 1, where the prefill's largest block was 3,840 MiB
/// (`docs/oracle.md`, "Why the model reads low on three rows").
fn gathered_experts_fresh(
    block: &Block,
    prefill: &Pass,
    seqs: f64,
    decode: f64,
    largest: f64,
) -> f64 {
    if block.experts_per_token <= 0.0 {
        return 0.0;
    }
    let down = seqs * block.experts_per_token * block.ffn * block.h * prefill.c;
    let fresh: f64 = [2.0 * down, down].iter().filter(|&&g| g > largest).sum();
    let p = forward_peak(block, prefill);
    (p + fresh - p.max(decode)).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-1.7B eager at 16 × 1,984: one segment of the fp32 softmax, 2 × 16 × 32 × 1,984²
    /// × 2 B = 7,688 MiB (already a whole 2 MiB multiple), on top of the replay; SDPA nothing.
    #[test]
    fn an_eager_prefill_counts_one_score_segment_beyond_its_replay() {
        let d = prefill_replay::smollm2(2.0, Some(prefill_replay::Softmax::Copy));
        assert_eq!(eager_unreplayed_segment(&d) / 1_048_576.0, 7688.0);
        let sdpa = prefill_replay::Decoder { eager: None, ..d };
        assert!(eager_unreplayed_segment(&sdpa).abs() < f64::EPSILON);
    }

    fn llama_1b() -> Block {
        Block {
            h: 2048.0,
            q: 2048.0,
            kv: 512.0,
            heads: 32.0,
            ffn: 8192.0,
            vocab: 128_256.0,
            layers: 16.0,
            mlp: Mlp::Gated,
            family: ModelType::Llama,
            experts_per_token: 0.0,
            experts: 0.0,
            sliding_window: 0.0,
        }
    }

    fn pass(b: f64, s: f64) -> Pass {
        Pass {
            b,
            s,
            c: 2.0,
            sdpa: true,
            half: false,
        }
    }

    #[test]
    fn prefill_holds_three_mlp_tensors_and_two_hidden_copies_beside_the_mlp_input() {
        let (block, p) = (llama_1b(), pass(128.0, 992.0));
        let t = p.t();
        // inputs_embeds + layer input + residual sum + normed input, then act, up, product.
        let expected = 4.0 * t * 2048.0 * 2.0 + 3.0 * t * 8192.0 * 2.0;
        assert_eq!(forward_peak(&block, &p), expected);
    }

    #[test]
    fn phi3_keeps_the_fused_gate_up_output_through_its_chunks() {
        let (mut block, p) = (llama_1b(), pass(4.0, 4000.0));
        let gated = forward_peak(&block, &p);
        block.family = ModelType::Phi3;
        block.mlp = Mlp::FusedGated;
        assert_eq!(
            forward_peak(&block, &p) - gated,
            p.t() * block.ffn * 2.0,
            "one more T x I tensor"
        );
    }

    #[test]
    fn gemma_scales_its_embeddings_into_a_new_tensor() {
        let (mut block, p) = (llama_1b(), pass(2.0, 4096.0));
        let plain = forward_peak(&block, &p);
        block.family = ModelType::Gemma2;
        assert_eq!(forward_peak(&block, &p) - plain, p.t() * block.h * 2.0);
    }

    #[test]
    fn eager_attention_materialises_scores_and_mask() {
        let block = llama_1b();
        let sdpa = pass(1.0, 8192.0);
        let eager = Pass {
            sdpa: false,
            ..sdpa
        };
        // At 8k tokens the fp32 softmax dwarfs the MLP: the attention phase decides.
        // 10 bytes per score in 16 bits (the scores, softmax's fp32 copy, its output), less the
        // MLP phase it replaces as the peak.
        assert!(
            forward_peak(&block, &eager)
                > forward_peak(&block, &sdpa) + 32.0 * 8192.0 * 8192.0 * 9.5
        );
    }

    #[test]
    fn fp16_eager_softmax_converts_inside_its_kernel_and_bf16_copies_first() {
        // SmolLM2-1.7B eager at 16 x 2,048 (1,984 prompt tokens): the H100 allocated 3.75 GiB
        // less in fp16 than in bf16, 2 bytes per score (`SoftMax.cpp`: CUDA `Half` with
        // `dtype=Float` runs `_softmax(half_to_float=true)`, `BFloat16` is copied to fp32 first).
        let block = llama_1b();
        let bf16 = Pass {
            sdpa: false,
            ..pass(16.0, 1984.0)
        };
        let fp16 = Pass { half: true, ..bf16 };
        assert_eq!(block.score_bytes(&bf16), 10.0);
        assert_eq!(block.score_bytes(&fp16), 8.0);
        let scores = bf16.b * block.heads * bf16.s * bf16.s;
        assert_eq!(
            attention_transient(&block, &bf16) - attention_transient(&block, &fp16),
            2.0 * scores
        );
        // fp32 has no copy to skip; GPT-2's and Falcon's softmax keep the input's dtype.
        let fp32 = Pass { c: 4.0, ..fp16 };
        assert_eq!(block.score_bytes(&fp32), 8.0);
        let gpt2 = Block {
            family: ModelType::Gpt2,
            ..block
        };
        assert_eq!(gpt2.score_bytes(&fp16), gpt2.score_bytes(&bf16));
    }

    #[test]
    fn fp32_sdpa_on_grouped_query_attention_runs_the_math_kernel() {
        let block = llama_1b();
        let bf16 = pass(1.0, 8192.0);
        let fp32 = Pass { c: 4.0, ..bf16 };
        let scores = 8.0 * 32.0 * 8192.0 * 8192.0;
        assert!(forward_peak(&block, &fp32) > scores);
        assert!(forward_peak(&block, &bf16) < scores / 4.0);
        // Multi-head attention in fp32 goes to the memory-efficient kernel: no scores.
        let mha = Block {
            kv: block.q,
            ..block
        };
        assert!(forward_peak(&mha, &fp32) < scores / 4.0);
    }

    #[test]
    fn rms_norm_upcasts_twice_when_the_mlp_is_narrow() {
        // With a narrow MLP the norm's two fp32 copies (8 B per hidden unit) are the peak.
        let mut block = llama_1b();
        (block.ffn, block.q, block.kv) = (256.0, 256.0, 256.0);
        let p = pass(1.0, 1024.0);
        assert_eq!(
            forward_peak(&block, &p),
            2.0 * p.t() * block.h * 2.0 + 8.0 * p.t() * block.h
        );
    }

    #[test]
    fn bert_feeds_its_mlp_the_attention_output_itself() {
        let block = Block {
            h: 1024.0,
            q: 1024.0,
            kv: 1024.0,
            heads: 16.0,
            ffn: 4096.0,
            vocab: 30522.0,
            layers: 24.0,
            mlp: Mlp::Plain,
            family: ModelType::LayerNorm,
            experts_per_token: 0.0,
            experts: 0.0,
            sliding_window: 0.0,
        };
        let p = pass(256.0, 512.0);
        let t = p.t();
        assert_eq!(
            forward_peak(&block, &p),
            3.0 * t * 1024.0 * 2.0 + 2.0 * t * 4096.0 * 2.0
        );
    }

    #[test]
    fn lora_copies_each_adapted_input_to_fp32() {
        let (block, p) = (llama_1b(), pass(2.0, 4096.0));
        let lora = saved_per_layer(&block, &p, Trainable::Lora(0.0), Precision::Pure16);
        let full = saved_per_layer(&block, &p, Trainable::All, Precision::Pure16);
        let t = p.t();
        // LoRA: norms save only their fp32 input (4+4 per h); five fp32 input copies (q, k, v,
        // gate, up: 20 per h); o_proj's and down's inputs in fp32 (4 per q, 4 per I).
        // Full: norms 2x(4+2), q/k/v and gate/up share one 16-bit input each (2+2), o and down
        // their own 16-bit input.
        let diff =
            (8.0 + 20.0 - 12.0 - 4.0) * t * block.h + 2.0 * t * block.q + 2.0 * t * block.ffn;
        assert_eq!(lora - full, diff);
    }

    #[test]
    fn autocast_casts_each_linear_input_separately() {
        let (block, p) = (llama_1b(), pass(2.0, 1024.0));
        let amp = saved_per_layer(&block, &p, Trainable::All, Precision::Autocast);
        let pure = saved_per_layer(&block, &p, Trainable::All, Precision::Pure16);
        let t = p.t();
        // Norms: fp32 input (4) + fp32 normed (4) against 4 + 2; consumers 3 + 2 casts of 2 B
        // against two shared 16-bit inputs.
        assert_eq!(amp - pure, (2.0 * 2.0 + (10.0 - 4.0)) * t * block.h);
    }

    #[test]
    fn lora_dropout_saves_a_mask_per_adapted_input() {
        let (block, p) = (llama_1b(), pass(2.0, 1000.0));
        // q, k, v and gate, up see the hidden size, o the attention width, down the MLP's.
        let inputs = 5.0 * 2048.0 + 2048.0 + 8192.0;
        assert_eq!(
            lora_dropout_saved(&block, &p, Precision::Pure16),
            p.t() * inputs
        );
        assert_eq!(
            lora_dropout_saved(&block, &p, Precision::Fp32),
            5.0 * p.t() * inputs
        );
    }

    #[test]
    fn a_mixture_of_experts_routes_k_copies_of_each_token() {
        let (mut block, p) = (llama_1b(), pass(8.0, 32768.0));
        (block.ffn, block.experts_per_token) = (768.0, 8.0);
        let t = p.t();
        // Prefill: four `S·h` tensors of the k routed copies beside the held hidden states.
        assert_eq!(
            forward_peak(&block, &p),
            4.0 * t * 2048.0 * 2.0 + t * 8.0 * 2.0 * 4.0 * 2048.0
        );
        // Decode: each routed token gathers its expert's three matrices.
        assert_eq!(
            decode_step(&block, &pass(32.0, 1.0), 2.0),
            32.0 * 8.0 * 3.0 * 768.0 * 2048.0 * 2.0
        );
    }

    /// fp32 score matrices are one size per layer and come back whole; 16-bit ones sit beside
    /// softmax's fp32 copy, and the math kernel's per-call float mask may outgrow every other
    /// block: those keep the scores as the stranded tensor.
    #[test]
    fn fp32_scores_strand_nothing_unless_something_else_splits_them() {
        let block = llama_1b();
        // Grouped-query attention in fp32: SDPA's math kernel, 16 GiB of scores at 8 × 4,096.
        let fp32 = Pass {
            c: 4.0,
            ..pass(8.0, 4096.0)
        };
        let mlp = fp32.t() * block.ffn * 4.0;
        assert_eq!(
            largest_tensor(&block, &fp32),
            4.0 * 8.0 * 32.0 * 4096.0 * 4096.0
        );
        assert_eq!(stranding_tensor(&block, &fp32), mlp);
        // Eager in bf16: the fp32 softmax copy beside 16-bit scores.
        let eager = Pass {
            sdpa: false,
            ..pass(8.0, 4096.0)
        };
        assert_eq!(
            stranding_tensor(&block, &eager),
            largest_tensor(&block, &eager)
        );
        // One sequence of 16,384 in fp32: the math kernel's 1 GiB float causal mask outgrows the
        // 512 MiB MLP blocks and splits a freed score block.
        let long = Pass {
            c: 4.0,
            ..pass(1.0, 16_384.0)
        };
        assert!(4.0 * 16_384.0 * 16_384.0 > long.t() * block.ffn * 4.0);
        assert_eq!(
            stranding_tensor(&block, &long),
            largest_tensor(&block, &long)
        );
        // Falcon-7B in bf16: one KV head without `enable_gqa`, so the math kernel, whose scores
        // are fp32 although the inputs are 16-bit: nothing stranded there either.
        let falcon = falcon_7b();
        let bf16 = pass(4.0, 1984.0);
        assert!(bf16.math_kernel(&falcon));
        assert_eq!(
            stranding_tensor(&falcon, &bf16),
            largest_outside_attention(&falcon, &bf16)
        );
        assert!(largest_tensor(&falcon, &bf16) > largest_outside_attention(&falcon, &bf16));
    }

    /// SDPA's math kernel copies the cache's keys to every head in a decode step (Falcon's
    /// broadcast `matmul`, beside the fp32 copies of its 16-bit k and v; fp32 grouped-query
    /// attention's `repeat_interleave` of k and v and the scaled k), and a training step's score
    /// `bmm`s save fp32 q, k and v per head; a fused kernel does neither.
    #[test]
    fn the_math_kernel_copies_keys_per_head_in_decode_and_saves_fp32_inputs_in_training() {
        let falcon = falcon_7b();
        let bf16 = pass(4.0, 2048.0);
        let (b, s) = (4.0, 2048.0);
        assert_eq!(
            math_kernel_decode(&falcon, &bf16),
            4.0 * b * s * falcon.q + 8.0 * b * s * falcon.kv
        );
        assert!(decode_step(&falcon, &bf16, 2.0) >= math_kernel_decode(&falcon, &bf16));
        assert_eq!(
            score_inputs_saved(&falcon, &bf16, 2.0),
            12.0 * bf16.t() * falcon.q
        );
        let llama = llama_1b();
        let fp32 = Pass {
            c: 4.0,
            ..pass(4.0, 2048.0)
        };
        assert_eq!(math_kernel_decode(&llama, &fp32), 12.0 * b * s * llama.q);
        assert_eq!(math_kernel_decode(&llama, &bf16), 0.0);
        assert_eq!(
            score_inputs_saved(&llama, &bf16, 2.0),
            6.0 * bf16.t() * llama.q
        );
    }

    /// Without a mask handed in, the math kernel is causal and builds its own fp32 mask in
    /// every call (`ones(L, S).tril()`, converted): `4·s²` more than with the mask given.
    #[test]
    fn the_causal_math_kernel_builds_its_own_fp32_mask() {
        let llama = llama_1b();
        let fp32 = Pass {
            c: 4.0,
            ..pass(1.0, 16_384.0)
        };
        assert!(fp32.math_kernel(&llama) && !llama.sdpa_mask(&fp32) && !llama.fused_qkv());
        let t = fp32.t();
        let hidden_and_projections = t * llama.h * 4.0 + t * 4.0 * (llama.q + 2.0 * llama.kv);
        assert_eq!(
            attention_transient(&llama, &fp32),
            hidden_and_projections + 4.0 * 16_384.0 * 16_384.0 + math_kernel_bytes(&llama, &fp32)
        );
    }

    /// Qwen3-0.6B's shape: every prefill block is a whole number of cache blocks, so none holds
    /// as many copies one token longer.
    fn qwen3_06b() -> Block {
        Block {
            h: 1024.0,
            q: 2048.0,
            kv: 1024.0,
            heads: 16.0,
            ffn: 3072.0,
            vocab: 151_936.0,
            layers: 28.0,
            mlp: Mlp::Gated,
            family: ModelType::QkNorm,
            experts_per_token: 0.0,
            experts: 0.0,
            sliding_window: 0.0,
        }
    }

    /// The first decode step's key and value copies, one token longer than the prefill's
    /// blocks: one per layer goes to the blocks the prefill freed, the rest to fresh 2 MiB-rounded
    /// segments.
    #[test]
    fn cache_copies_a_token_longer_than_the_prefill_blocks_take_fresh_segments() {
        let (block, p) = (qwen3_06b(), pass(32.0, 8128.0));
        let mib = 1_048_576.0;
        let largest = largest_tensor(&block, &p);
        // An MLP intermediate, 1,524 MiB, is the largest tensor.
        assert_eq!(largest, p.t() * 3072.0 * 2.0);
        // Slots for a 508.06 MiB copy: the MLP's three 1,524 MiB blocks and the two stranded
        // ones two each, the norm's two 1,016 MiB fp32 copies one each.
        let slots = 5.0 * 2.0 + 2.0;
        assert_eq!(
            cache_relocation_fresh(&block, &p, 2.0, largest),
            (28.0 - slots) * 510.0 * mib
        );
        // Llama-3.1-8B at batch 16 × 1,984: 62 MiB copies, hundreds of slots in 868 MiB MLP
        // blocks, nothing fresh.
        let llama = Block {
            h: 4096.0,
            q: 4096.0,
            kv: 1024.0,
            ffn: 14_336.0,
            layers: 32.0,
            ..llama_1b()
        };
        let p = pass(16.0, 1984.0);
        let largest = largest_tensor(&llama, &p);
        assert_eq!(cache_relocation_fresh(&llama, &p, 2.0, largest), 0.0);
    }

    /// Copies of at most 1 MiB come from the small pool, where each layer's freed pair leaves a
    /// whole 2 MiB segment for the next layer's: only the first layer's take a new one.
    #[test]
    fn small_cache_copies_take_one_small_segment() {
        let (block, p) = (qwen3_06b(), pass(1.0, 256.0));
        // 256 tokens × 1,024 × 2 B = 512 KiB, one token more rounds to 514 KiB.
        let fresh = cache_relocation_fresh(&block, &p, 2.0, largest_tensor(&block, &p));
        assert_eq!(fresh, 2.0 * 1_048_576.0);
    }

    /// Past step 1, each 2 MiB crossing of the copies' size makes two segments of the new size
    /// (one layer's key and value), which every later copy outgrows: Qwen3-0.6B at batch 32 ×
    /// 7,936 + 256 new tokens crosses from its 498 MiB segments to 512 MiB in seven steps of
    /// 2 MiB (the H200 trace: 1,500, 1,004, 1,008, … 1,024 MiB at steps 33, 65, … 225).
    #[test]
    fn each_later_crossing_of_the_cache_size_takes_two_fresh_segments() {
        let (block, p) = (qwen3_06b(), pass(32.0, 7936.0));
        let mib = 1_048_576.0;
        let step_one = cache_relocation_fresh(&block, &p, 2.0, largest_tensor(&block, &p));
        assert!(step_one > 0.0);
        let sizes: f64 = (1..=7).map(|i| 498.0 + 2.0 * f64::from(i)).sum();
        assert_eq!(
            cache_crossings_fresh(&block, &p, 2.0, Some(8192.0), step_one),
            2.0 * sizes * mib
        );
        // Within one segment's 2 MiB (32 steps at 64 KiB a token) nothing is made.
        assert_eq!(
            cache_crossings_fresh(&block, &p, 2.0, Some(7936.0 + 32.0), step_one),
            0.0
        );
        assert_eq!(
            cache_crossings_fresh(&block, &p, 2.0, Some(7936.0 + 34.0), step_one),
            2.0 * 500.0 * mib
        );
    }

    /// The default annotations size the prefill over the whole context and state no
    /// generation length: the first crossing past step 1 is counted, two segments of the size
    /// after the 514 MiB ones of step 1.
    #[test]
    fn an_unstated_generation_counts_its_first_crossing() {
        let (block, p) = (qwen3_06b(), pass(32.0, 8192.0));
        let step_one = cache_relocation_fresh(&block, &p, 2.0, largest_tensor(&block, &p));
        assert!(step_one > 0.0);
        assert_eq!(
            cache_crossings_fresh(&block, &p, 2.0, None, step_one),
            2.0 * 516.0 * 1_048_576.0
        );
    }

    /// Copies that all fit the prefill's blocks at step 1 live there and grow into each other's
    /// merged holes; copies under 10 MiB share 20 MiB segments. Neither makes a segment per
    /// crossing.
    #[test]
    fn crossings_make_segments_only_for_copies_alone_in_their_own() {
        let (block, p) = (qwen3_06b(), pass(32.0, 7936.0));
        assert_eq!(cache_crossings_fresh(&block, &p, 2.0, None, 0.0), 0.0);
        // Batch 1 × 2,048: 4 MiB copies, in the 20 MiB segments' pool, even on their way to
        // 64 MiB at 32k.
        let short = pass(1.0, 2048.0);
        assert_eq!(
            cache_crossings_fresh(&block, &short, 2.0, Some(32_768.0), 2.0 * 1_048_576.0),
            0.0
        );
    }

    /// A mixture of experts decoding at wide batch gathers expert weights larger than any block
    /// its prefill freed: those segments come on top of the prefill's; a narrow batch, or a
    /// dense model, adds nothing.
    #[test]
    fn gathered_expert_weights_larger_than_the_prefill_blocks_get_fresh_segments() {
        let mut block = llama_1b();
        (block.ffn, block.experts_per_token) = (768.0, 8.0);
        let p = pass(256.0, 512.0);
        let largest = largest_tensor(&block, &p);
        let down = 256.0 * 8.0 * 768.0 * 2048.0 * 2.0;
        assert!(
            down > largest,
            "both gathers exceed the prefill's largest block"
        );
        let decode = decode_step(&block, &pass(256.0, 544.0), 2.0);
        let prefill = forward_peak(&block, &p);
        assert_eq!(
            gathered_experts_fresh(&block, &p, 256.0, decode, largest),
            prefill + 3.0 * down - prefill.max(decode)
        );
        let narrow = pass(2.0, 2048.0);
        let d2 = decode_step(&block, &pass(2.0, 2048.0), 2.0);
        let l2 = largest_tensor(&block, &narrow);
        assert_eq!(gathered_experts_fresh(&block, &narrow, 2.0, d2, l2), 0.0);
        let dense = llama_1b();
        assert_eq!(
            gathered_experts_fresh(&dense, &p, 256.0, decode, largest),
            0.0
        );
    }

    #[test]
    fn phi_has_gpt2s_mlp_and_norms_and_llamas_attention() {
        // `PhiMLP` runs `NewGELUActivation` over `fc1`'s output and `PhiDecoderLayer` normalises
        // with `LayerNorm` (not fp32 `RMSNorm` copies and one fused GELU, the Llama layout);
        // `PhiAttention` rotates q and k and its eager softmax runs in fp32 (not GPT-2's 16-bit
        // scores and probabilities).
        let family = ModelType::from_model_type("phi");
        let block = Block {
            family,
            mlp: Mlp::Plain,
            ..llama_1b()
        };
        assert!(block.composed_gelu() && block.layer_norm() && block.rotary());
        let p = pass(4.0, 2048.0);
        assert_eq!(block.score_bytes(&p), 10.0);
        let gpt2 = Block {
            family: ModelType::Gpt2,
            ..block
        };
        assert_eq!(gpt2.score_bytes(&p), 4.0);
        assert!(!gpt2.rotary());
        let p = pass(4.0, 2048.0);
        assert_eq!(
            mlp_transient(&block, p.t(), 2.0),
            mlp_transient(&gpt2, p.t(), 2.0)
        );
    }

    #[test]
    fn a_window_shorter_than_the_sequence_saves_its_mask_and_repeated_kv() {
        let (mut block, p) = (llama_1b(), pass(1.0, 16384.0));
        let plain = saved_per_layer(&block, &p, Trainable::All, Precision::Pure16);
        block.sliding_window = 4096.0;
        let windowed = saved_per_layer(&block, &p, Trainable::All, Precision::Pure16);
        // The float mask (`attn_bias`) and k and v repeated from kv to q width.
        assert_eq!(
            windowed - plain,
            2.0 * p.s * p.s + 2.0 * 2.0 * p.t() * (block.q - block.kv)
        );
        block.sliding_window = 32768.0;
        assert_eq!(
            saved_per_layer(&block, &p, Trainable::All, Precision::Pure16),
            plain
        );
    }

    #[test]
    fn lora_on_experts_keeps_each_layers_folded_expert_weights() {
        // Qwen3-30B-A3B's layer: 128 experts of I = 768 over h = 2048.
        let block = Block {
            ffn: 768.0,
            experts_per_token: 8.0,
            experts: 128.0,
            ..llama_1b()
        };
        let p = pass(1.0, 1024.0);
        let dense = Block {
            experts: 0.0,
            ..block
        };
        let lora = |b: &Block, prec| saved_per_layer(b, &p, Trainable::Lora(16.0), prec);
        assert_eq!(
            lora(&block, Precision::Pure16) - lora(&dense, Precision::Pure16),
            128.0 * 3.0 * 768.0 * 2048.0 * 2.0
        );
        // Under autocast the frozen weights, and so their folded copies, are fp32.
        assert_eq!(
            lora(&block, Precision::Autocast) - lora(&dense, Precision::Autocast),
            128.0 * 3.0 * 768.0 * 2048.0 * 4.0
        );
        // Full fine-tuning trains the experts' own weights: nothing is folded.
        assert_eq!(
            saved_per_layer(&block, &p, Trainable::All, Precision::Pure16),
            saved_per_layer(&dense, &p, Trainable::All, Precision::Pure16)
        );
    }

    #[test]
    fn gemma2s_eager_training_saves_its_soft_capped_scores() {
        let eager = |family| {
            let block = Block {
                family,
                ..llama_1b()
            };
            let p = Pass {
                sdpa: false,
                ..pass(1.0, 4096.0)
            };
            let sdpa = Pass { sdpa: true, ..p };
            saved_per_layer(&block, &p, Trainable::All, Precision::Autocast)
                - saved_per_layer(&block, &sdpa, Trainable::All, Precision::Autocast)
        };
        // `tanh`'s 16-bit output, one per score, beside Llama's fp32 softmax and its cast.
        let scores = llama_1b().heads * 4096.0 * 4096.0;
        assert_eq!(
            eager(ModelType::Gemma2) - eager(ModelType::Llama),
            2.0 * scores
        );
    }

    #[test]
    fn autocast_runs_gpt2s_eager_softmax_in_fp32() {
        // Eager attention in training: the score path is what differs.
        let block = Block {
            family: ModelType::Gpt2,
            mlp: Mlp::Plain,
            ..llama_1b()
        };
        let p = Pass {
            sdpa: false,
            ..pass(2.0, 1024.0)
        };
        let scores = p.b * block.heads * p.s * p.s;
        let pure = saved_per_layer(&block, &p, Trainable::All, Precision::Pure16);
        let amp = saved_per_layer(&block, &p, Trainable::All, Precision::Autocast);
        let eager = |prec| {
            let sdpa = Pass { sdpa: true, ..p };
            saved_per_layer(&block, &p, Trainable::All, prec)
                - saved_per_layer(&block, &sdpa, Trainable::All, prec)
        };
        // 16-bit: the 16-bit softmax output; autocast: its fp32 output and the 16-bit cast.
        assert!(amp > pure);
        assert_eq!(
            eager(Precision::Autocast) - eager(Precision::Pure16),
            4.0 * scores
        );
    }

    #[test]
    fn gpt2s_composed_gelu_keeps_four_intermediates() {
        let (mut block, p) = (llama_1b(), pass(4.0, 1024.0));
        (block.family, block.mlp) = (ModelType::LayerNorm, Mlp::Plain);
        let plain = mlp_transient(&block, p.t(), 2.0);
        block.family = ModelType::Gpt2;
        assert_eq!(mlp_transient(&block, p.t(), 2.0), 2.0 * plain);
        let saved = saved_per_layer(&block, &p, Trainable::All, Precision::Pure16);
        let amp = saved_per_layer(&block, &p, Trainable::All, Precision::Autocast);
        block.family = ModelType::LayerNorm;
        assert_eq!(
            saved - saved_per_layer(&block, &p, Trainable::All, Precision::Pure16),
            3.0 * 2.0 * p.t() * block.ffn
        );
        // Under autocast `pow`'s fp32 input copy, `tanh`'s output and `1 + tanh` are fp32.
        assert_eq!(
            amp - saved_per_layer(&block, &p, Trainable::All, Precision::Autocast),
            (3.0 * 4.0 + 2.0 - 2.0) * p.t() * block.ffn
        );
    }

    #[test]
    fn a_sliding_window_past_its_length_builds_a_mask_and_repeats_k_and_v() {
        let (mut block, p) = (llama_1b(), pass(8.0, 32768.0));
        let full = forward_peak(&block, &p);
        block.sliding_window = 4096.0;
        let mask = 8.0 * 32768.0 * 32768.0;
        assert!(forward_peak(&block, &p) >= full + mask);
        // Within the window nothing changes.
        block.sliding_window = 65536.0;
        assert_eq!(forward_peak(&block, &p), full);
    }

    fn falcon_7b() -> Block {
        Block {
            h: 4544.0,
            q: 4544.0,
            kv: 64.0,
            heads: 71.0,
            ffn: 18176.0,
            vocab: 65024.0,
            layers: 32.0,
            mlp: Mlp::Plain,
            family: ModelType::Falcon,
            experts_per_token: 0.0,
            experts: 0.0,
            sliding_window: 0.0,
        }
    }

    #[test]
    fn falcon_builds_its_causal_mask_and_sdpa_converts_it_in_every_layer() {
        // Multi-head Falcon (`multi_query` false): equal heads, so a fused kernel takes the mask.
        let block = Block {
            kv: 4544.0,
            ..falcon_7b()
        };
        let p = pass(8.0, 32768.0);
        let (t, c, bss) = (p.t(), p.c, p.b * p.s * p.s);
        // Held: `inputs_embeds`, the layer input and the boolean mask; in attention: the normed
        // input, the fused qkv output kept by its views, the rotated q and k, and the mask's
        // `logical_not` beside its float conversion.
        let attention = t * block.h * c
            + t * (block.q + 2.0 * block.kv) * c
            + t * (block.q + block.kv) * c
            + (c + 1.0) * bss;
        assert_eq!(
            forward_peak(&block, &p),
            2.0 * t * block.h * c + bss + attention
        );
        // Without a mask (SDPA with `is_causal`), the MLP phase would be the peak.
        let unmasked = Block {
            family: ModelType::LayerNorm,
            ..block
        };
        assert!(forward_peak(&block, &p) > forward_peak(&unmasked, &p) + 2.0 * bss);
    }

    #[test]
    fn falcons_multi_query_attention_runs_the_math_kernel() {
        // Falcon-7B hands SDPA 71 query heads and one kv head without `enable_gqa`: cuDNN and
        // flash refuse unequal heads without it, the efficient kernel always. 16 bits too.
        let (block, p) = (falcon_7b(), pass(4.0, 2048.0));
        let scores = 9.0 * p.b * block.heads * p.s * p.s;
        assert!(p.math_kernel(&block));
        assert!(forward_peak(&block, &p) > scores);
        // Multi-head Falcon, and the new decoder architecture (Falcon-40B: 8 kv heads of 64,
        // broadcast to every head before SDPA), run a fused kernel: no scores.
        for kv in [block.q, 8.0 * 64.0] {
            let fused = Block { kv, ..block };
            assert!(!p.math_kernel(&fused));
            assert!(forward_peak(&fused, &p) < scores / 4.0);
        }
        // Llama's grouped-query attention gets `enable_gqa`: cuDNN in 16 bits.
        assert!(!p.math_kernel(&llama_1b()));
    }

    #[test]
    fn the_math_kernel_holds_fp32_scores_their_softmax_and_a_boolean_per_score() {
        // fp32 grouped-query attention: the scaled q, k and v repeated to every head, and per
        // score the fp32 scores, `_safe_softmax`'s output and its `isneginf` boolean.
        let block = llama_1b();
        let p = Pass {
            c: 4.0,
            ..pass(8.0, 4096.0)
        };
        let (t, bhss) = (p.t(), p.b * block.heads * p.s * p.s);
        assert_eq!(
            math_kernel_bytes(&block, &p),
            4.0 * t * block.q + 8.0 * t * block.q + 9.0 * bhss
        );
        // Falcon in bf16: fp32 copies of q, k and v and the scaled q; k stays one head.
        let (falcon, p) = (falcon_7b(), pass(4.0, 2048.0));
        let (t, bhss) = (p.t(), p.b * falcon.heads * p.s * p.s);
        assert_eq!(
            math_kernel_bytes(&falcon, &p),
            4.0 * t * (falcon.q + 2.0 * falcon.kv) + 4.0 * t * falcon.q + 9.0 * bhss
        );
    }

    #[test]
    fn falcons_eager_attention_holds_four_score_matrices() {
        let block = falcon_7b();
        let p = pass(4.0, 2048.0);
        assert_eq!(block.score_bytes(&p), 8.0);
        let gpt2 = Block {
            family: ModelType::Gpt2,
            ..block
        };
        assert_eq!(gpt2.score_bytes(&p), 4.0);
    }

    #[test]
    fn sdpa_converts_a_windows_boolean_mask_to_the_query_dtype() {
        let (mut block, p) = (llama_1b(), pass(8.0, 32768.0));
        block.sliding_window = 4096.0;
        let (t, c, bss) = (p.t(), p.c, p.b * p.s * p.s);
        // Normed input, q, k, v, then k and v repeated beside the mask's two conversions
        // (RoPE's temporaries are gone by then).
        assert_eq!(
            attention_transient(&block, &p),
            t * block.h * c
                + t * c * (block.q + 2.0 * block.kv)
                + 2.0 * t * block.q * c
                + 3.0 * bss
        );
    }

    #[test]
    fn gemma2_saves_its_soft_capped_logits() {
        let mut block = llama_1b();
        let plain = loss_peak(&block, 10.0, Precision::Pure16);
        block.family = ModelType::Gemma2;
        assert_eq!(
            loss_peak(&block, 10.0, Precision::Pure16) - plain,
            2.0 * 10.0 * block.vocab
        );
        assert_eq!(
            loss_peak(&block, 10.0, Precision::Fp32) - plain,
            4.0 * 10.0 * block.vocab
        );
    }

    /// Gemma-2-2B's full fine-tunes: where step 1's state is more than one logits segment holds,
    /// step 2's `tanh` output (saved for backward) splits a whole fp32 segment and the loss takes
    /// one fresh segment more. One H200 reserved 53.51–53.57 GiB at 4 × 2,048, 8 × 1,024 and
    /// 2 × 4,096 checkpointed (the oracle's replay the same to the byte; the history in
    /// `tests/data/h200d/traces`), 86.36 at 2 × 8,192 checkpointed and 51.47 at 4 × 1,024
    /// without checkpointing; without the moved block the count reads 49.25, 78.09 and 47.69.
    /// Llama-3.2-1B's logits, freed before backward, borrow no segment: its 8 × 2,048 keeps one
    /// fresh segment per pinned one.
    /// A model's `config.json` from `tests/data/oracle-configs` (public configs the oracle and
    /// the real-GPU rows ran).
    fn oracle_config(name: &str) -> String {
        let path = format!(
            "{}/../../tests/data/oracle-configs/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// The reserved GiB `estimate` gives a model's `config.json` with `engine: hf` and
    /// `annotations` (without the `peakfit.io/` prefix) on top.
    fn hf_reserved_gib(json: &str, annotations: &[(&str, &str)]) -> f64 {
        let mut map: std::collections::BTreeMap<String, String> =
            crate::model::hf_config::annotations(json)
                .unwrap()
                .annotations
                .into_iter()
                .map(|(k, v)| (format!("peakfit.io/{k}"), v))
                .collect();
        for (k, v) in [("engine", "hf")].iter().chain(annotations) {
            map.insert(format!("peakfit.io/{k}"), (*v).to_string());
        }
        let spec = crate::model::Spec::parse(&map).unwrap();
        let e = crate::model::estimate(&spec, crate::model::estimate::Defaults::GPU_TOTAL);
        e.reserved_bytes as f64 / GIB
    }

    #[test]
    fn gemma2s_saved_logits_leave_the_state_pinned_segments_for_an_fp32_one() {
        fn reserved_gib(json: &str, shape: &[(&str, &str)]) -> f64 {
            let full: Vec<(&str, &str)> = [
                ("workload", "training"),
                ("dtype", "bf16"),
                ("optimizer", "adamw"),
            ]
            .iter()
            .chain(shape)
            .copied()
            .collect();
            hf_reserved_gib(json, &full)
        }
        let gemma = include_str!("../../../../../tests/data/oracle-configs/gemma-2-2b.json");
        for (batch, context, checkpointing, measured) in [
            ("4", "2048", "full", 53.57),
            ("8", "1024", "full", 53.57),
            ("2", "4096", "full", 53.51),
            ("2", "8192", "full", 86.36),
            ("4", "1024", "none", 51.47),
        ] {
            let shape = [
                ("batch", batch),
                ("context-tokens", context),
                ("gradient-checkpointing", checkpointing),
            ];
            let r = reserved_gib(gemma, &shape);
            assert!(
                (measured..measured * 1.1).contains(&r),
                "{shape:?}: {r:.2} GiB, measured {measured}"
            );
        }
        let llama = include_str!("../../../../../tests/data/oracle-configs/llama-3.2-1b.json");
        let shape = [
            ("batch", "8"),
            ("context-tokens", "2048"),
            ("gradient-checkpointing", "full"),
        ];
        let r = reserved_gib(llama, &shape);
        // Measured 39.75 GiB (`tests/data/h200c`, foreach); a moved block would read 47.1.
        assert!(
            (39.0..40.0).contains(&r),
            "Llama-3.2-1B 8 x 2,048: {r:.2} GiB"
        );
    }

    /// A LoRA step's small pool: the adapters' gradients, AdamW moments and foreach's square
    /// roots take 2 MiB segments of their own, and at the next step's peak only the moments
    /// live there. The oracle's allocator walks (`tools/oracle/train_events.py --grid --steps 2`,
    /// the small pool's segments from the weights to the end of step 2, less the moments'
    /// bytes): Llama-3.1-8B rank 16 in bf16 at 4 × 2,048, 802 − 162 MiB of segments, 320 MiB of
    /// moments; Qwen3-4B rank 16 under autocast at 8 × 2,048, 644 − 128 MiB, 252 MiB of moments
    /// (its 16-bit casts come first and are freed before the gradients, which reuse them). The
    /// step's own small tensors (the rotary tables at 2,048 positions, the norms' per-row
    /// scalars) take a few more segments, which the term leaves out: 8 MiB of Qwen3-4B's.
    /// Fused AdamW makes no roots; SGD and other optimizers are not followed (nothing counted).
    #[test]
    fn lora_adapters_small_pool_segments_outlive_their_gradients_and_roots() {
        fn slack_mib(json: &str, extra: &[(&str, &str)]) -> f64 {
            let mut pairs: Vec<(String, String)> = crate::model::hf_config::annotations(json)
                .unwrap()
                .annotations
                .into_iter()
                .collect();
            pairs.extend(
                [
                    ("engine", "hf"),
                    ("workload", "lora"),
                    ("gradient-checkpointing", "full"),
                    ("lora-rank", "16"),
                    ("batch", "4"),
                    ("context-tokens", "2048"),
                ]
                .iter()
                .chain(extra)
                .map(|(k, v)| ((*k).to_string(), (*v).to_string())),
            );
            // A later pair of the same key replaces an earlier one.
            let pairs: std::collections::BTreeMap<&str, &str> = pairs
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let pairs: Vec<(&str, &str)> = pairs.into_iter().collect();
            let inp = super::super::resolve(
                &crate::model::estimate::testing::spec(&pairs),
                &mut Vec::new(),
            );
            adapter_small_pool_slack(&inp, &inp.block()) / 1_048_576.0
        }
        let llama = &oracle_config("llama-3.1-8b");
        let qwen3 = &oracle_config("qwen3-4b");
        let bf16 = slack_mib(llama, &[("dtype", "bf16"), ("optimizer", "adamw")]);
        assert!((bf16 - (802.0 - 162.0 - 320.0)).abs() <= 4.0, "{bf16} MiB");
        let amp = slack_mib(qwen3, &[("dtype", "fp16-amp"), ("optimizer", "adamw")]);
        assert!((amp - (644.0 - 128.0 - 252.0)).abs() <= 8.0, "{amp} MiB");
        // Fused: the gradients' segments only.
        let fused = slack_mib(llama, &[("dtype", "bf16"), ("optimizer", "adamw-fused")]);
        assert!((fused - 160.0).abs() <= 4.0, "{fused} MiB");
        let sgd = slack_mib(llama, &[("dtype", "bf16"), ("optimizer", "sgd")]);
        assert!(sgd.abs() < 1e-9, "{sgd} MiB");
        // Without checkpointing each adapted linear's fp32 `lora_A` output (4 · 8,192 · 16 B,
        // small) is saved into those blocks: 7 linears × 32 layers × 0.5 MiB fewer.
        let saved = slack_mib(
            llama,
            &[
                ("dtype", "bf16"),
                ("optimizer", "adamw"),
                ("gradient-checkpointing", "none"),
            ],
        );
        assert!((bf16 - saved - 112.0).abs() < 1e-6, "{bf16} {saved} MiB");
    }

    /// LoRA under autocast with checkpointing: the forward's layers strand what
    /// [`lora_replay`] finds (each layer's fp32 output kept in a block its MLP freed). Reserved
    /// peaks measured on an H200 (Qwen3-4B `tests/data/h200d`, Mistral-7B v0.3 rank 32
    /// `h200d`, Qwen2.5-7B `h200b`) and the oracle's allocator replays of ten more
    /// (`scripts/oracle case ... --workload lora --dtype fp16-amp --gradient-checkpointing
    /// full`, `peak_reserved_bytes`; the last six were run after the replay was written, to
    /// judge it): each within [measured, +3 %), with the small pool's segments
    /// ([`adapter_small_pool_slack`]) and the layers' count on top. Without the replay the count
    /// read the first seven low (the GPU rows by 3.6–7.3 %, Qwen3-4B 8 × 2,048 at 54.95 GiB for
    /// the GPU's 59.26; the oracle's four by at least 2.4 %).
    #[test]
    fn autocast_loras_checkpointed_layers_strand_what_the_replay_finds() {
        // (config, batch, context, rank, reserved GiB: the GPU's for the first three, else the
        // oracle's replay)
        for (name, batch, context, rank, measured) in [
            ("qwen3-4b", "8", "2048", "16", 59.26),
            ("mistral-7b-v0.3", "8", "1024", "32", 38.45),
            ("qwen2.5-7b", "2", "4096", "16", 51.73),
            ("qwen3-4b", "4", "2048", "16", 37.87),
            ("qwen2.5-1.5b", "8", "2048", "16", 44.27),
            ("llama-3.2-1b", "8", "2048", "16", 36.13),
            ("llama-3.2-3b", "4", "4096", "16", 49.43),
            ("qwen3-8b", "2", "4096", "64", 56.33),
            ("llama-3.1-8b", "1", "16384", "16", 73.60),
            ("qwen2.5-3b", "4", "2048", "32", 32.87),
            ("mistral-nemo-12b", "2", "2048", "16", 60.48),
            ("smollm2-1.7b", "16", "1024", "8", 21.89),
            ("qwen2.5-14b", "1", "4096", "16", 71.83),
        ] {
            let r = hf_reserved_gib(
                &oracle_config(name),
                &[
                    ("workload", "lora"),
                    ("dtype", "fp16-amp"),
                    ("optimizer", "adamw"),
                    ("gradient-checkpointing", "full"),
                    ("batch", batch),
                    ("context-tokens", context),
                    ("lora-rank", rank),
                ],
            );
            assert!(
                (measured..measured * 1.03).contains(&r),
                "{name} {batch} x {context} r{rank}: {r:.2} GiB, measured {measured}"
            );
        }
    }

    #[test]
    fn gemma_norms_save_their_fp32_output_when_the_weight_trains() {
        let mut block = llama_1b();
        assert_eq!(norm_saved(&block, Trainable::All, Precision::Pure16), 6.0);
        block.family = ModelType::Gemma2;
        assert_eq!(norm_saved(&block, Trainable::All, Precision::Pure16), 8.0);
        assert_eq!(
            norm_saved(&block, Trainable::Lora(16.0), Precision::Pure16),
            4.0
        );
    }

    #[test]
    fn attention_backward_holds_the_score_gradients_and_cudas_product_where_scores_exist() {
        let llama = llama_1b();
        let mut phi = llama_1b();
        phi.family = ModelType::Phi;
        let mut gpt2 = llama_1b();
        gpt2.family = ModelType::Gpt2;
        let mut falcon = llama_1b();
        falcon.family = ModelType::Falcon;
        falcon.kv = falcon.h / falcon.heads;
        assert!(falcon.unequal_heads_without_gqa());
        let sdpa16 = pass(1.0, 4096.0);
        let sdpa32 = Pass { c: 4.0, ..sdpa16 };
        let eager = Pass {
            sdpa: false,
            ..sdpa16
        };
        let half = Pass {
            half: true,
            ..eager
        };
        let eager32 = Pass { c: 4.0, ..eager };
        // (what, block, pass, precision, bytes per score beside the saved tensors)
        let cases = [
            // The math kernel: the probabilities' gradient, CUDA's `grad * output` and the
            // scores' gradient, fp32 each, in fp32 on grouped-query attention and in 16 bits for
            // Falcon's multi-query heads handed over without `enable_gqa`.
            ("math fp32", &llama, sdpa32, Precision::Fp32, 12.0),
            ("math falcon bf16", &falcon, sdpa16, Precision::Pure16, 12.0),
            // An fp32 softmax: the same three, less the saved 16-bit probabilities freed by
            // then; for fp16 the input gradient is 16-bit (`half_to_float`), not under autocast,
            // whose scores reach softmax in fp32.
            ("eager bf16", &llama, eager, Precision::Pure16, 10.0),
            ("eager fp16", &llama, half, Precision::Pure16, 8.0),
            (
                "eager fp16 autocast",
                &llama,
                half,
                Precision::Autocast,
                10.0,
            ),
            ("eager fp32", &llama, eager32, Precision::Fp32, 12.0),
            // Phi passes `dtype=float32` too, though its blocks use LayerNorm.
            ("phi bf16", &phi, eager, Precision::Pure16, 10.0),
            // A softmax that keeps the compute dtype: three tensors of it; under autocast its
            // fp32 list runs the softmax in fp32, which then goes as Llama's does.
            ("gpt2 bf16", &gpt2, eager, Precision::Pure16, 6.0),
            ("gpt2 fp32", &gpt2, eager32, Precision::Fp32, 12.0),
            ("gpt2 autocast", &gpt2, eager, Precision::Autocast, 10.0),
            ("gpt2 fp16 autocast", &gpt2, half, Precision::Autocast, 10.0),
            // Falcon eager passes the residual stream's dtype: it keeps 16 bits.
            ("falcon eager bf16", &falcon, eager, Precision::Pure16, 6.0),
        ];
        for (what, block, p, prec, per_score) in cases {
            let scores = block.heads * 4096.0 * 4096.0;
            assert_eq!(
                backward_transient(block, &p, prec),
                per_score * scores,
                "{what}"
            );
        }
        // SDPA's fused kernels keep no scores: the MLP's three gradients.
        assert_eq!(
            backward_transient(&llama, &sdpa16, Precision::Pure16),
            3.0 * 2.0 * 4096.0 * 8192.0
        );
    }

    #[test]
    fn the_prefill_runs_over_the_prompt_when_it_is_annotated() {
        use crate::model::estimate::testing::{est_with, part};
        let base = [
            ("model", "llama-3.1-8b"),
            ("engine", "hf"),
            ("workload", "inference"),
            ("dtype", "bf16"),
            ("batch", "64"),
        ];
        let whole = est_with(&base, &[("context-tokens", "4096")]);
        let prompt = est_with(
            &base,
            &[("context-tokens", "4096"), ("prompt-tokens", "2048")],
        );
        let short = est_with(&base, &[("context-tokens", "2048")]);
        // The prefill's activations are the prompt's; the cache still holds the whole context.
        assert_eq!(part(&prompt, "activations"), part(&short, "activations"));
        assert!(part(&prompt, "activations") < part(&whole, "activations"));
        assert_eq!(part(&prompt, "kv-cache"), part(&whole, "kv-cache"));
    }

    /// An encoder-decoder's allocator slack is its largest phase (bytes past the weights and
    /// the workspace) less the tensors at its allocated peak.
    fn assert_slack_is_phase(e: &crate::model::estimate::Estimate, phase: f64) {
        use crate::model::estimate::testing::part;
        let allocated = part(e, "activations") + part(e, "kv-cache") + part(e, "logits");
        let slack = part(e, "allocator-slack");
        assert!(
            (slack - (phase - allocated)).abs() < 4.0,
            "{slack} {phase} {allocated}"
        );
    }

    /// Whisper's reserved is its largest phase, not the allocated peak plus two of the
    /// encoder's MLP blocks: the decoder's cross-attention copies are carved out of the blocks
    /// the encoder freed or take segments rounded to 2 MiB, and the decode's self-attention
    /// relocation holds that cache twice.
    #[test]
    fn whisper_reserves_its_largest_phase_not_the_encoders_blocks_on_top() {
        use crate::model::estimate::testing::est;
        let mib = 1_048_576.0;
        let large_v3 = |batch: &'static str| {
            est(&[
                ("model", "whisper-large-v3"),
                ("workload", "inference"),
                ("dtype", "fp16"),
                ("batch", batch),
            ])
        };
        let e = large_v3("16");
        // 32 decoder layers, 20 heads of 64, 16 sequences of 1,500 frames: 58.59 MiB copies in
        // 60 MiB segments; the preset's self-attention cache over `n_text_ctx` (448 tokens),
        // 40 KiB a token per copy: 10 MiB at 256 tokens, 17.46 MiB at 447, so the decode
        // crosses 10, 12, … 18 MiB, the three 60 MiB blocks in flight holding 15, 12, 9, 6, 6
        // of the 64 copies.
        let copy = 16.0 * 1500.0 * 1280.0 * 2.0;
        let self_cache = 64.0 * 16.0 * 448.0 * 1280.0 * 2.0;
        let logits = 16.0 * 51_865.0 * 6.0;
        let crossings = 51.0 * 10.0 + 54.0 * 12.0 + 57.0 * 14.0 + 60.0 * 16.0 + 60.0 * 18.0;
        let decode = copy + (64.0 + 3.0) * 60.0 * mib + crossings * mib + logits;
        assert_slack_is_phase(&e, decode);
        // At batch 1 a copy is 3.66 MiB, under `kMinLargeAlloc`: five share a 20 MiB segment,
        // so the 64 copies reserve 13 segments.
        let one = large_v3("1");
        let copy = 1500.0 * 1280.0 * 2.0;
        let decode = copy + 13.0 * 20.0 * mib + 2.0 * self_cache / 16.0 + 51_865.0 * 6.0;
        assert_slack_is_phase(&one, decode);
    }

    /// whisper-small's shape (with the MLP width given) at fp16, batch 32 × 64 tokens, and the
    /// first decoder call's reserved: the encoder's output, the 24 cross-attention copies and three
    /// more blocks, each in a 72 MiB segment, and the logits.
    fn whisper_small_b32_x64(intermediate: &str) -> (crate::model::estimate::Estimate, f64) {
        let mib = 1_048_576.0;
        let e = crate::model::estimate::testing::est(&[
            ("architecture", "encoder-decoder"),
            ("encoder-positions", "1500"),
            ("params", "241734912"),
            ("layers", "24"),
            ("hidden-size", "768"),
            ("attention-heads", "12"),
            ("kv-heads", "12"),
            ("head-dim", "64"),
            ("intermediate-size", intermediate),
            ("vocab-size", "51865"),
            ("workload", "inference"),
            ("dtype", "fp16"),
            ("batch", "32"),
            ("context-tokens", "64"),
        ]);
        let copy = 32.0 * 1500.0 * 768.0 * 2.0;
        let logits = 32.0 * 51_865.0 * 6.0;
        (e, copy + (24.0 + 3.0) * 72.0 * mib + logits)
    }

    /// A short decode leaves the first decoder call the largest phase: the 24 cross-attention
    /// copies of whisper-small at batch 32 (70.3 MiB, each in a 72 MiB segment) and three free
    /// blocks of a copy's size (two from the call, `WhisperAttention.forward`'s contiguous key
    /// and value alive through `DynamicLayer.update`; a third not traced, see
    /// [`seq2seq_slack`]). The oracle's replay of this case reserves 260 MiB past what is
    /// allocated after that call; two would count 185.
    #[test]
    fn whispers_first_decoder_call_holds_three_projections_in_flight() {
        let (e, first) = whisper_small_b32_x64("3072");
        assert_slack_is_phase(&e, first);
    }

    /// whisper-small fp16 at batch 64 × 448: a copy grows 96 KiB a token (64 × 768 × 2 B), so
    /// from 10 MiB (107 tokens, a 12 MiB segment) to 42 MiB at 447 tokens it crosses 16 sizes.
    /// The first decoder call's three 142 MiB blocks hold `3·(floor(142 / X) − 1)` copies of
    /// `X`, all 24 up to 14 MiB; past that the rest take segments of their own. The oracle's
    /// replay reserved 10,736 MiB; without the crossings the model read 6,077.
    #[test]
    fn whispers_long_decode_strands_a_segment_per_copy_at_each_crossing() {
        let mib = 1_048_576.0;
        let per_token = 64.0 * 768.0 * 2.0;
        let total = seq2seq_crossings(24.0, per_token, 448.0, 142.0 * mib);
        let expected: f64 = (6..=21)
            .map(|k| {
                let size = 2.0 * f64::from(k);
                let slots = 3.0 * ((142.0 / size).floor() - 1.0);
                (2.0 + (24.0 - slots).max(0.0)) * size
            })
            .sum();
        assert_eq!(total / mib, expected);
        assert_eq!(expected, 6522.0);
        // Under 10 MiB (large-v3 at batch 4: 4.4 MiB at 448 tokens) nothing is rounded alone.
        assert_eq!(
            seq2seq_crossings(64.0, 4.0 * 1280.0 * 2.0, 448.0, 20.0 * mib),
            0.0
        );
    }

    /// Beam search repeats the encoder's output per beam (`_expand_inputs_for_generation`) and
    /// `reorder_cache` re-selects a cross-attention copy in flight each decode step: five beams
    /// of one input reserve what five inputs do, and one copy more.
    #[test]
    fn whisper_beams_repeat_the_encoder_output_and_reorder_a_copy() {
        use crate::model::estimate::testing::{est, part};
        let run = |batch: &'static str, beams: &'static str| {
            let e = est(&[
                ("model", "whisper-large-v3"),
                ("workload", "inference"),
                ("dtype", "fp16"),
                ("batch", batch),
                ("beams", beams),
            ]);
            part(&e, "allocator-slack") + part(&e, "activations")
        };
        let copy = 5.0 * 1500.0 * 1280.0 * 2.0;
        let beams = run("1", "5");
        let inputs = run("5", "1");
        assert!(
            (beams - inputs - allocator::block(copy)).abs() < 4.0,
            "{beams} {inputs}"
        );
    }

    /// The encoder's phase wins where its MLP is wide: whisper-small's shape at batch 32 × 64
    /// with an 8× MLP (24,576), whose `fc1` output is 32 × 1,500 × 24,576 × 2 B = 2,250 MiB a
    /// block; the encoder's forward strands `HF_SLACK_INFERENCE_TENSORS` of them, more than the
    /// first decoder call's 27 blocks of 72 MiB. Without phase 1 the slack would be that call's.
    #[test]
    fn whispers_encoder_phase_wins_with_a_wide_mlp() {
        use crate::model::estimate::testing::part;
        let (e, first) = whisper_small_b32_x64("24576");
        let allocated = part(&e, "activations") + part(&e, "kv-cache") + part(&e, "logits");
        let fc1 = 32.0 * 1500.0 * 24_576.0 * 2.0;
        let slack = part(&e, "allocator-slack");
        assert!(
            slack > first - allocated + fc1,
            "{slack} {first} {allocated}"
        );
    }

    #[test]
    fn loss_holds_three_fp32_logit_tensors() {
        assert_eq!(
            loss_peak(&llama_1b(), 10.0, Precision::Pure16),
            120.0 * 128_256.0
        );
    }

    /// SmolLM2-1.7B's shape, fully fine-tuned under autocast with SGD and checkpointing: the
    /// oracle's peak (21.471 GiB, as the H100 measured) is in the forward, at `cross_entropy`,
    /// where autocast's cache still holds a bf16 copy of every linear weight (3.19 GiB) beside
    /// the bf16 logits, their fp32 copy and `log_softmax`'s output.
    fn smollm2_amp(extra: &[(&'static str, &'static str)]) -> crate::model::Estimate {
        crate::model::estimate::testing::est_with(
            &[
                ("engine", "hf"),
                ("model-type", "llama"),
                ("layers", "24"),
                ("hidden-size", "2048"),
                ("attention-heads", "32"),
                ("kv-heads", "32"),
                ("head-dim", "64"),
                ("vocab-size", "49152"),
                ("intermediate-size", "8192"),
                ("tied-embeddings", "true"),
                ("params", "1711376384"),
                ("workload", "training"),
                ("dtype", "fp16-amp"),
                ("batch", "4"),
                ("context-tokens", "2048"),
                ("gradient-checkpointing", "full"),
            ],
            extra,
        )
    }

    #[test]
    fn autocast_keeps_every_trainable_weight_copy_until_the_forward_ends() {
        use crate::model::estimate::testing::part;
        let e = smollm2_amp(&[("optimizer", "sgd")]);
        let (t, v) = (4.0 * 2048.0, 49152.0);
        assert_eq!(part(&e, "autocast-weights"), 2.0 * 1_711_376_384.0);
        assert_eq!(part(&e, "logits"), (2.0 + 8.0) * t * v);
        // Each layer's fp32 input (checkpointed) and the final norm's and head's saved inputs.
        assert_eq!(part(&e, "activations"), (24.0 * 4.0 + 10.0) * t * 2048.0);
        assert_eq!(part(&e, "gradients"), 0.0);
        // LoRA's frozen weights are not cached: their casts die with each layer's forward.
        let lora = smollm2_amp(&[("workload", "lora"), ("lora-rank", "8")]);
        assert!(part(&lora, "autocast-weights") < 1e9);
    }

    /// The LoRA factors are fp32 leaves that require grad, so autocast caches their 16-bit
    /// casts for the whole forward and, without recomputation, each linear node saves its
    /// factor's cast for backward: beside the frozen weights' casts, at backward's start.
    #[test]
    fn autocast_keeps_the_lora_factors_copies_too() {
        use crate::model::estimate::testing::part;
        let lora = smollm2_amp(&[
            ("workload", "lora"),
            ("lora-rank", "64"),
            ("gradient-checkpointing", "none"),
        ]);
        // The frozen weights' casts are every parameter's (the embedding is the tied head);
        // the factors' are half their fp32 bytes ("adapters").
        assert_eq!(
            part(&lora, "autocast-weights"),
            2.0 * 1_711_376_384.0 + part(&lora, "adapters") / 2.0
        );
    }

    #[test]
    fn qk_norms_save_fp32_copies_of_q_and_k() {
        let (mut block, p) = (llama_1b(), pass(1.0, 512.0));
        let plain = saved_per_layer(&block, &p, Trainable::Lora(8.0), Precision::Pure16);
        block.family = ModelType::QkNorm;
        let normed = saved_per_layer(&block, &p, Trainable::Lora(8.0), Precision::Pure16);
        assert_eq!(normed - plain, 4.0 * p.t() * (block.q + block.kv));
    }

    const GIB: f64 = 1_073_741_824.0;

    fn llama8b_generate(extra: &[(&'static str, &'static str)]) -> crate::model::Estimate {
        crate::model::estimate::testing::est_with(
            &[
                ("model", "llama-3.1-8b"),
                ("model-type", "llama"),
                ("engine", "hf"),
                ("workload", "inference"),
                ("dtype", "bf16"),
            ],
            extra,
        )
    }

    /// Issue 20's dangerous case: Llama-3.1-8B bf16 at batch 4, a stated prompt of 2,048 tokens
    /// and 6,144 new ones. The heap of [`prefill_replay`] run through every decode step
    /// (`prefill_replay`'s ignored `every_decode_step_of_a_long_generation`) reserves 36.721 GiB
    /// at the end: 17.428 after the prefill, and 19.293 more as the copies (16 MiB at the prompt,
    /// 64 MiB at the end) outgrow the prefill's freed blocks, from about 32 MiB on. Step 1 fits
    /// (the replay makes no segment there), so the crossings term did not count any of it, and
    /// the estimate read about 21 GiB.
    #[test]
    fn a_short_prompt_and_a_long_generation_reserve_what_every_decode_step_makes() {
        let e = llama8b_generate(&[
            ("batch", "4"),
            ("context-tokens", "8192"),
            ("prompt-tokens", "2048"),
        ]);
        let reserved = e.reserved_bytes as f64 / GIB;
        assert!(reserved >= 36.721, "{reserved}");
        assert!(reserved < 36.721 * 1.25, "{reserved}");
    }

    /// Qwen2.5-1.5B full fine-tunes in bf16 without checkpointing, AdamW, with `extra`.
    fn qwen25_15b_training(extra: &[(&'static str, &'static str)]) -> crate::model::Estimate {
        crate::model::estimate::testing::est_with(
            &[
                ("model-type", "qwen2"),
                ("layers", "28"),
                ("hidden-size", "1536"),
                ("attention-heads", "12"),
                ("kv-heads", "2"),
                ("head-dim", "128"),
                ("intermediate-size", "8960"),
                ("vocab-size", "151936"),
                ("tied-embeddings", "true"),
                ("engine", "hf"),
                ("workload", "training"),
                ("dtype", "bf16"),
                ("gradient-checkpointing", "none"),
                ("flash-attention", "true"),
                ("context-tokens", "1024"),
            ],
            extra,
        )
    }

    /// A full fine-tune without checkpointing reserves what [`train_replay`] replays of its
    /// first two steps: the first step's state pins the layers' activation blocks it lands in,
    /// and the second step's forward takes fresh segments for them. One H200 reserved 18.92,
    /// 22.94 and 30.68 GiB at 1, 2 and 4 × 1,024 under foreach AdamW (`tests/data/h200c`);
    /// the segment count alone read 16.40, 18.43 and 27.23; the replay reads 18.92, 22.45 and
    /// 29.51 (the oracle's allocator replay of the same steps, less its small pool). With the fused
    /// kernel (no `_foreach_sqrt` list) 2 × 1,024 reserved 20.58; the replay reads 20.09.
    #[test]
    fn a_full_fine_tune_without_checkpointing_reserves_what_its_two_steps_replay() {
        for (batch, optimizer, replayed) in [
            ("1", "adamw", 20_313_014_272_u64),
            ("2", "adamw", 24_100_470_784),
            ("4", "adamw", 31_690_063_872),
            ("2", "adamw-fused", 21_567_111_168),
        ] {
            let e = qwen25_15b_training(&[("batch", batch), ("optimizer", optimizer)]);
            assert_eq!(
                e.reserved_bytes,
                replayed.max(e.allocated_bytes),
                "{batch} {optimizer}"
            );
        }
    }

    /// Qwen3-0.6B bf16 `generate` at batch 32 with `extra` (the context among them).
    fn qwen3_06b_generate(extra: &[(&'static str, &'static str)]) -> crate::model::Estimate {
        crate::model::estimate::testing::est_with(
            &[
                ("model-type", "qwen3"),
                ("layers", "28"),
                ("hidden-size", "1024"),
                ("attention-heads", "16"),
                ("kv-heads", "8"),
                ("head-dim", "128"),
                ("intermediate-size", "3072"),
                ("vocab-size", "151936"),
                ("tied-embeddings", "true"),
                ("engine", "hf"),
                ("workload", "inference"),
                ("dtype", "bf16"),
                ("batch", "32"),
            ],
            extra,
        )
    }

    /// Where step 1 already makes segments, the later growth is the larger of two per crossing
    /// (the 8k trace, whose prefill's blocks hold every copy) and the copies the replay's room
    /// does not hold at each 2 MiB level. Qwen3-0.6B at 32 × 1,024 + 1,024: the copies grow from
    /// 64 to 128 MiB, past every block the 1,024-token prefill freed, so nearly all 58 copies
    /// take a segment at each of the 32 levels. One H200 reserved 59.38 GiB for 8.29 allocated
    /// (`tests/data/h200b`, `h200b-qwen3-0.6b-b32-2k-n1024`, the card to itself); the heap
    /// replayed step by step ends at 69.54. Two per crossing alone read 16.59.
    #[test]
    fn copies_that_outgrow_the_prefills_room_are_counted_after_a_first_step_that_made_segments() {
        let e = qwen3_06b_generate(&[("context-tokens", "2048"), ("prompt-tokens", "1024")]);
        let reserved = e.reserved_bytes as f64 / GIB;
        assert!(reserved >= 59.38, "{reserved}");
        assert!(reserved < 69.54 * 1.1, "{reserved}");
    }

    /// Without `prompt-tokens` the decode is counted one 2 MiB level past the prefill, and the
    /// estimate says so, with the tokens per level (2 MiB over 32 × 8 × 128 × 2 bytes a step).
    #[test]
    fn an_unstated_prompt_is_an_assumption_that_names_the_growth() {
        let e = qwen3_06b_generate(&[("context-tokens", "2048")]);
        assert!(
            e.assumed
                .iter()
                .any(|a| a.starts_with("prompt-tokens unstated") && a.contains("further 32 ")),
            "{:?}",
            e.assumed
        );
        let stated = qwen3_06b_generate(&[("context-tokens", "2048"), ("prompt-tokens", "2000")]);
        assert!(!stated.assumed.iter().any(|a| a.contains("prompt-tokens")));
    }

    /// A training row's spec, its resolved inputs and the estimate's allocated peak and slack.
    fn training_case(pairs: &[(&str, &str)]) -> (Inputs, f64, f64) {
        use crate::model::estimate::testing::{part, spec};
        let spec = spec(pairs);
        let e =
            crate::model::estimate::estimate(&spec, crate::model::estimate::Defaults::GPU_TOTAL);
        let allocated: f64 = e
            .components
            .iter()
            .filter(|c| c.counter == crate::model::estimate::Counter::Allocated)
            .map(|c| c.bytes as f64)
            .sum();
        let inp = super::super::resolve(&spec, &mut Vec::new());
        (inp, allocated, part(&e, "allocator-slack"))
    }

    /// Llama-3.2-1B as `tests/data/h200b`'s config builds it, fully fine-tuned in bf16 with
    /// checkpointing and foreach AdamW, as `measure.py` runs it.
    fn llama32_1b_training(batch: &'static str) -> Vec<(&'static str, &'static str)> {
        vec![
            ("layers", "16"),
            ("hidden-size", "2048"),
            ("attention-heads", "32"),
            ("kv-heads", "8"),
            ("head-dim", "64"),
            ("intermediate-size", "8192"),
            ("vocab-size", "128256"),
            ("tied-embeddings", "true"),
            ("params", "1235814400"),
            ("dtype", "bf16"),
            ("model-type", "llama"),
            ("engine", "hf"),
            ("workload", "training"),
            ("optimizer", "adamw"),
            ("gradient-checkpointing", "full"),
            ("batch", batch),
            ("context-tokens", "2048"),
        ]
    }

    /// A paged optimizer's state is in unified memory (`cudaMallocManaged`), outside the
    /// caching allocator: it takes no freed block and displaces no loss segment, so the step's
    /// slack is a stateless optimizer's. Subtracting it from an allocated peak that never held
    /// it read 1.60 GiB for Llama-3.2-1B at 4 × 4,864 where the stateless step leaves 5.24.
    #[test]
    fn a_paged_optimizers_state_takes_no_segment() {
        let with = |optimizer: &'static str| {
            let mut pairs = llama32_1b_training("4");
            pairs.extend([("optimizer", optimizer), ("context-tokens", "4864")]);
            training_case(&pairs).2
        };
        let paged = with("paged-adamw");
        assert!((paged - with("adafactor")).abs() < 1.0, "{paged}");
        assert!(paged > 5.0 * 1_073_741_824.0, "{paged}");
    }

    /// `AdamW._init_group` makes each parameter's two moments in parameter order, the
    /// embedding's first: behind it the loss's segments are filled by the layers' matrices
    /// (tied embeddings) or, last, an untied head's `V·h`, whose size a segment may be left
    /// short by. An adapter's tensors are its rank by its widest side.
    #[test]
    fn the_state_tensors_that_fill_the_loss_segments_are_sized_by_parameter_order() {
        let case = |extra: &[(&'static str, &'static str)]| {
            let mut pairs = llama32_1b_training("4");
            pairs.extend(extra);
            let (inp, _, _) = training_case(&pairs);
            let (grads, _, state) = inp.trainable_state();
            largest_state_tensor(&inp, &inp.block(), grads, state)
        };
        // bf16 AdamW: 2 bytes per gradient and per moment.
        assert!((case(&[]) - 2.0 * 8192.0 * 2048.0).abs() < 1.0);
        assert!((case(&[("tied-embeddings", "false")]) - 2.0 * 128_256.0 * 2048.0).abs() < 1.0);
        // LoRA: fp32 adapters, rank 16 by the MLP's 8,192.
        assert!(
            (case(&[("workload", "lora"), ("lora-rank", "16")]) - 4.0 * 16.0 * 8192.0).abs() < 1.0
        );
    }

    /// The first step's loss leaves `lm_head`'s 16-bit logits segment free beside its fp32
    /// segments, and LoRA's state is too small to displace anything: a LoRA step's slack is that
    /// segment plus the layers' stranded blocks, here one of each of the three fp32 tensors
    /// PEFT's expression makes at `gate_proj`/`up_proj` (`T·I·4`), larger than any 16-bit
    /// activation, plus the small pool's segments the adapters' gradients and roots leave
    /// ([`adapter_small_pool_slack`], tested on its own).
    #[test]
    fn a_lora_step_strands_the_logits_segment_and_the_adapters_fp32_outputs() {
        let mut pairs = llama32_1b_training("4");
        pairs.extend([("workload", "lora"), ("lora-rank", "16")]);
        let (inp, _, slack) = training_case(&pairs);
        let t = 4.0 * 2048.0;
        let logits = 2.0 * t * 128_256.0;
        let adapter_output = 4.0 * t * 8192.0;
        let block = inp.block();
        let small_pool = adapter_small_pool_slack(&inp, &block);
        assert!(small_pool > 0.0);
        assert!(
            (slack - (logits + 3.0 * adapter_output + small_pool)).abs() < 2.0,
            "{slack}"
        );
        let pass = inp.pass(inp.batch, inp.context);
        assert!((training_stranded(&inp, &block, &pass) - 3.0 * adapter_output).abs() < 1.0);
    }

    /// h200-llama32-1b-ft-bf16-b4-2k-gc: the first `optimizer.step()` puts 4.6 GiB of AdamW
    /// state beside 2.3 GiB of gradients; what the layers' freed blocks and the logits'
    /// segment do not hold breaks one fp32 `4·T·V` segment (4,008 MiB), which the second step's
    /// loss takes fresh (the oracle's replay: one 4,008 MiB segment at step 2, reserved 21.045
    /// GiB, measured 21.045).
    #[test]
    fn the_first_optimizer_step_costs_the_loss_one_fresh_fp32_segment() {
        let (inp, allocated, slack) = training_case(&llama32_1b_training("4"));
        let (_, _, state) = inp.trainable_state();
        let t = 4.0 * 2048.0;
        let fp32 = 4.0 * t * 128_256.0;
        let logits = 2.0 * t * 128_256.0;
        let stranded = HF_SLACK_INFERENCE_TENSORS * 2.0 * t * 8192.0;
        let first = allocated - state + logits + stranded;
        assert!(
            (allocated + slack - (first + fp32)).abs() < 2.0,
            "{} {}",
            allocated + slack,
            first + fp32
        );
    }

    /// Llama-3.2-3B at 4 × 2k: 12 GiB of state and 6 GiB of gradients break all three fp32
    /// segments, so the second step's loss takes all three and its logits' segment fresh, on
    /// top of the optimizer step's own peak (weights, gradients, state and foreach AdamW's
    /// `_foreach_sqrt` list): the replay's step 2 makes 2,004 + 3 × 4,008 MiB.
    #[test]
    fn a_state_past_every_fp32_segment_takes_the_whole_loss_again() {
        let pairs: Vec<(&str, &str)> = vec![
            ("layers", "28"),
            ("hidden-size", "3072"),
            ("attention-heads", "24"),
            ("kv-heads", "8"),
            ("head-dim", "128"),
            ("intermediate-size", "8192"),
            ("vocab-size", "128256"),
            ("tied-embeddings", "true"),
            ("params", "3212749824"),
            ("dtype", "bf16"),
            ("model-type", "llama"),
            ("engine", "hf"),
            ("workload", "training"),
            ("optimizer", "adamw"),
            ("gradient-checkpointing", "full"),
            ("batch", "4"),
            ("context-tokens", "2048"),
        ];
        let (inp, allocated, slack) = training_case(&pairs);
        let (grads, _, state) = inp.trainable_state();
        let tv = 4.0 * 2048.0 * 128_256.0;
        let step = inp.weights() + grads + state + state / 2.0;
        assert!(
            (allocated + slack - (step + 12.0 * tv + 2.0 * tv)).abs() < 2.0,
            "{} {}",
            allocated + slack,
            step + 14.0 * tv
        );
    }

    /// Gemma-2's soft-capped logits leave two 16-bit segments, the logits and `logits / cap`;
    /// in fp32 `logits.float()` is the logits themselves and leaves none.
    #[test]
    fn the_logits_segments_follow_the_soft_cap_and_the_precision() {
        let mut gemma = llama_1b();
        gemma.family = ModelType::Gemma2;
        let one = 2.0 * 100.0 * 128_256.0;
        assert!((logits_segments(&llama_1b(), 100.0, Precision::Pure16) - one).abs() < 1.0);
        assert!((logits_segments(&gemma, 100.0, Precision::Autocast) - 2.0 * one).abs() < 1.0);
        assert!(logits_segments(&llama_1b(), 100.0, Precision::Fp32).abs() < 1.0);
    }

    /// Phi-3-mini-4k's `config.json` as annotations (`sliding_window` 2,047), a bf16 `generate`
    /// at batch 2 with `extra` (the context among them).
    fn phi3_mini_4k(extra: &[(&str, &str)]) -> Inputs {
        let mut pairs = vec![
            ("layers", "32"),
            ("hidden-size", "3072"),
            ("attention-heads", "32"),
            ("kv-heads", "32"),
            ("head-dim", "96"),
            ("intermediate-size", "8192"),
            ("vocab-size", "32064"),
            ("tied-embeddings", "false"),
            ("params", "3821079552"),
            ("dtype", "bf16"),
            ("model-type", "phi3"),
            ("sliding-window", "2047"),
            ("engine", "hf"),
            ("workload", "inference"),
            ("batch", "2"),
        ];
        pairs.extend(extra);
        super::super::resolve(
            &crate::model::estimate::testing::spec(&pairs),
            &mut Vec::new(),
        )
    }

    /// A sliding-window cache the prompt fills keeps its copies at `window` tokens
    /// (`DynamicSlidingWindowLayer.update`): Phi-3-mini eager at 2 × 4,032 + 12,352 takes the
    /// replay's prefill and decode steps and the eager score segment as its slack, and none of
    /// the growth to 16,383 tokens that a growing cache's terms count.
    #[test]
    fn a_filled_sliding_window_cache_grows_no_further() {
        let inp = phi3_mini_4k(&[
            ("flash-attention", "false"),
            ("context-tokens", "16384"),
            ("prompt-tokens", "4032"),
        ]);
        let block = inp.block();
        let prefill = inp.pass(inp.batch, inp.prompt);
        let d = replayed_decoder(&inp, &block, &prefill).expect("Phi-3 eager is replayed");
        let r = prefill_replay::replay(&d);
        assert_eq!(
            slack(&inp, 0.0),
            r.prefill_slack + r.decode_fresh + eager_unreplayed_segment(&d)
        );
        // What a growing cache's terms would add: the copies grown to 16,383 tokens.
        let growth = if r.decode_fresh > 0.0 {
            cache_crossings_fresh(
                &block,
                &prefill,
                inp.kv_bytes,
                Some(16384.0),
                r.decode_fresh,
            )
        } else {
            r.outgrown_fresh(&d, 16383.0)
        };
        assert!(growth > 0.0);
    }

    /// Phi-3 eager in fp16 is replayed too: its softmax takes the half-to-float road
    /// (`softmax(dtype=float32)` of fp16 scores converts inside the kernel), which
    /// `prefill_replay::eager` follows for Llama's layer (checked against the oracle on the
    /// H100's SmolLM2-1.7B fp16 eager row). The H200's Phi-3-mini fp16 eager row at 2 × 4,032 + 64
    /// (`tests/data/h200b`) reserved 19.36 GiB: the count of stranded tensors said 26.23, the
    /// replay says 23.47, 3.88 of it the unreplayed score segment (`4·b·heads·s²`). In fp32 the
    /// softmax road is the plain one Llama's layer was checked on, which Phi-3's was not: it
    /// keeps the count.
    #[test]
    fn phi3_eager_in_fp16_is_replayed_and_fp32_is_not() {
        for (dtype, replayed) in [("bf16", true), ("fp16", true), ("fp32", false)] {
            let inp = phi3_mini_4k(&[
                ("flash-attention", "false"),
                ("context-tokens", "4096"),
                ("prompt-tokens", "4032"),
                ("dtype", dtype),
            ]);
            let block = inp.block();
            let prefill = inp.pass(inp.batch, inp.prompt);
            assert_eq!(
                replayed_decoder(&inp, &block, &prefill).is_some(),
                replayed,
                "{dtype}"
            );
        }
    }

    /// Only the `model_type`s whose modeling file the replay follows are replayed: the same
    /// shape under Gemma v1, Cohere, Granite, `InternLM2`, `OLMo` or mllama's code (all
    /// [`ModelType::Llama`]) keeps the analytic slack.
    #[test]
    fn the_replay_runs_only_for_the_modeling_code_it_follows() {
        use crate::model::estimate::testing::spec;
        // Whether the replay is taken as exact for a 4 × 4,096 bf16 `generate` of this preset,
        // with `model-type` stated or not.
        let exact = |model: &str, model_type: Option<&str>| {
            let mut pairs = vec![
                ("model", model),
                ("engine", "hf"),
                ("workload", "inference"),
                ("dtype", "bf16"),
                ("batch", "4"),
                ("context-tokens", "4096"),
            ];
            pairs.extend(model_type.map(|t| ("model-type", t)));
            let inp = super::super::resolve(&spec(&pairs), &mut Vec::new());
            let prefill = inp.pass(inp.batch, inp.prompt);
            inp.replayed_code && replayed_decoder(&inp, &inp.block(), &prefill).is_some()
        };
        let chosen = |model_type: &str| exact("llama-3.1-8b", Some(model_type));
        for t in ["llama", "mistral", "qwen2", "Qwen2", "qwen3"] {
            assert!(chosen(t), "{t}");
        }
        // A Llama-layout type the replay does not follow allocates at least what Llama's code
        // does for the same shape: the replay is its floor, in the short-prompt long-generation
        // case too (the review's probe had Gemma 47 % below Llama there without the floor).
        let reserved = |model_type: &str, prompt: &str| {
            crate::model::estimate::testing::est(&[
                ("model", "llama-3.1-8b"),
                ("model-type", model_type),
                ("engine", "hf"),
                ("workload", "inference"),
                ("dtype", "bf16"),
                ("batch", "4"),
                ("context-tokens", "8192"),
                ("prompt-tokens", prompt),
            ])
            .reserved_bytes
        };
        for t in ["gemma", "cohere", "granite", "internlm2", "olmo", "mllama"] {
            for prompt in ["2048", "8000"] {
                assert!(
                    reserved(t, prompt) >= reserved("llama", prompt),
                    "{t} at prompt {prompt}"
                );
            }
        }
        for t in [
            "gemma",
            "cohere",
            "granite",
            "internlm2",
            "olmo",
            "olmo2",
            "mllama",
            "yi",
            "deepseek_v3",
        ] {
            assert!(!chosen(t), "{t}");
        }
        // Falcon's code is replayed for Falcon-7B's layout only (one kv head: `multi_query`
        // without `new_decoder_architecture`), by its own layer; Falcon-40B's eight kv heads and
        // a multi-head Falcon (`multi_query` false) keep the analytic slack.
        assert!(exact("falcon-7b", None));
        assert!(!exact("falcon-40b", None));
        let inp = super::super::resolve(
            &spec(&[
                ("model", "falcon-7b"),
                ("kv-heads", "71"),
                ("engine", "hf"),
                ("workload", "inference"),
                ("batch", "4"),
            ]),
            &mut Vec::new(),
        );
        assert!(replayed_decoder(&inp, &inp.block(), &inp.pass(inp.batch, inp.prompt)).is_none());
        // Phi-3-mini's code is replayed under eager attention, past its window too, by its own
        // layer; under SDPA it keeps the analytic slack.
        let phi3 = |flash: &str| {
            let inp = phi3_mini_4k(&[("flash-attention", flash), ("context-tokens", "4096")]);
            replayed_decoder(&inp, &inp.block(), &inp.pass(inp.batch, inp.prompt))
                .filter(|_| inp.replayed_code)
                .map(|d| (d.layer, d.window))
        };
        assert_eq!(
            phi3("false"),
            Some((prefill_replay::Layer::Phi3, Some(2047.0)))
        );
        assert_eq!(phi3("true"), None);
        // A preset's own `model_type` counts: Qwen3's presets are typed `qwen3`.
        let s = spec(&[
            ("model", "qwen3-0.6b"),
            ("engine", "hf"),
            ("workload", "inference"),
            ("batch", "4"),
        ]);
        let inp = super::super::resolve(&s, &mut Vec::new());
        assert!(replayed_decoder(&inp, &inp.block(), &inp.pass(inp.batch, inp.prompt)).is_some());
        // The Llama, Mistral and Qwen2.5 presets carry their `model_type`, so a pod naming
        // only the preset is replayed; the presets of other code (mllama, `StableLM`,
        // `StarCoder`, BLOOM) are not.
        let preset = |model: &str| exact(model, None);
        for m in [
            "llama-2-7b",
            "llama-3.1-8b",
            "llama-3.1-70b",
            "mistral-7b",
            "qwen2.5-7b",
            "codellama-34b",
        ] {
            assert!(preset(m), "{m}");
        }
        for m in [
            "llama-3.2-11b-vision",
            "stablelm-base-alpha-3b",
            "starcoder-15.5b",
            "bloomz-7b1",
        ] {
            assert!(!preset(m), "{m}");
        }
    }
}
