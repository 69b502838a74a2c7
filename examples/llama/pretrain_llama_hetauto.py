"""Pretrain a GPT/LLaMA model with Megatron-LM's training loop, optionally as one heterogeneous hetauto job.

    # homogeneous, as with any Megatron entry script
    torchrun --nproc-per-node 8 pretrain_llama_hetauto.py <Megatron arguments>
    # one share of a multi-cluster plan: the same script, two more flags
    torchrun ... pretrain_llama_hetauto.py <Megatron arguments> --hetauto --hetauto-plan plan.yaml

It calls `megatron.training.pretrain` with a LLaMA-style GPTModel (the layer spec follows
--transformer-impl) and Megatron's MockGPTDataset (synthetic tokens; swap in your own dataset provider for
real data). Everything hetauto does lives in two calls: `hook.parse_and_validate_args` (Megatron's, plus the
--hetauto flags and the per-rank rewrite from the plan) and `hook.pretrain_kwargs` (the plan's process groups
and inter-cluster communicator, or nothing without --hetauto). On a machine without GPUs the CPU
redirections are applied, so the whole loop runs on CPU processes for a dry run.
"""
import os
import sys

# Running from a source checkout without installing the package: make hetauto_megatron importable.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.path.isdir(os.path.join(_ROOT, "hetauto_megatron")) and _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from hetauto_megatron.megatron import hook  # noqa: E402


def model_provider(pre_process=True, post_process=True, vp_stage=None, config=None, pg_collection=None):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.training import get_args
    from megatron.training.arguments import core_transformer_config_from_args

    args = get_args()
    config = config or core_transformer_config_from_args(args)
    if args.transformer_impl == "local":
        spec = specs.get_gpt_layer_local_spec(normalization=args.normalization, qk_layernorm=args.qk_layernorm)
    else:
        spec = specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=args.qk_layernorm)
    return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=args.padded_vocab_size,
                    max_sequence_length=args.max_position_embeddings, pre_process=pre_process,
                    post_process=post_process, fp16_lm_cross_entropy=args.fp16_lm_cross_entropy,
                    parallel_output=True, position_embedding_type=args.position_embedding_type,
                    rotary_percent=args.rotary_percent, rotary_base=args.rotary_base,
                    share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
                    pg_collection=pg_collection, vp_stage=vp_stage)


def datasets_provider(train_valid_test_num_samples, vp_stage=None):
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, MockGPTDataset
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
    from megatron.training import get_args

    args = get_args()
    config = GPTDatasetConfig(random_seed=args.seed, sequence_length=args.seq_length,
                              tokenizer=build_tokenizer(args), reset_position_ids=False,
                              reset_attention_mask=False, eod_mask_loss=False)
    # Every rank builds the (cheap) mock data and reads its own batches, so no rank depends on another
    # mesh's tensor-parallel group to receive them.
    return BlendedMegatronDatasetBuilder(MockGPTDataset, train_valid_test_num_samples, lambda: True,
                                        config).build()


datasets_provider.is_distributed = True


def forward_step(data_iterator, model):
    import torch

    batch = next(data_iterator)
    output = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])

    def loss_func(output_tensor):
        mask = batch["loss_mask"].view(-1).float()
        loss = torch.sum(output_tensor.view(-1).float() * mask)
        tokens = mask.sum().to(torch.int)
        return loss, tokens, {"lm loss": torch.cat([loss.detach().view(1), tokens.view(1)])}

    return output, loss_func


def main():
    args = hook.parse_and_validate_args(args_defaults={"tokenizer_type": "NullTokenizer"})
    from megatron.core.enums import ModelType
    from megatron.training import pretrain
    from megatron.training.argument_utils import pretrain_cfg_container_from_args

    config = pretrain_cfg_container_from_args(args, model_cfg=None)  # None: build through model_provider
    pretrain(config, datasets_provider, ModelType.encoder_or_decoder, forward_step,
             model_provider=model_provider, **hook.pretrain_kwargs(args))


if __name__ == "__main__":
    hook.main_guard(main)
