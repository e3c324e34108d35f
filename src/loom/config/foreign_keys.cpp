#include "loom/config/foreign_keys.h"

#include <fmt/format.h>

namespace loom::config {

namespace {

constexpr const char* kHf = "HF Trainer";
constexpr const char* kLf = "LLaMA-Factory";
constexpr const char* kSame = "the same value";

}  // namespace

const std::vector<ForeignKey>& foreign_keys() {
  static const std::vector<ForeignKey> table = {
      {"learning_rate", kHf, "training.lr", kSame},
      {"num_train_epochs", kHf, "training.epochs", kSame},
      {"max_steps", kHf, "training.steps", kSame},
      {"per_device_train_batch_size", kHf, "training.micro_batch_size", kSame},
      {"gradient_accumulation_steps", kHf, "training.global_batch_size",
       "global_batch_size = micro_batch_size x gradient_accumulation_steps x data-parallel ranks"},
      {"warmup_steps", kHf, "training.warmup_steps", kSame},
      {"warmup_ratio", kHf, "training.warmup_steps", "warmup_ratio x the step count, as a number of steps"},
      {"weight_decay", kHf, "training.weight_decay", kSame},
      {"adam_beta1", kHf, "training.adam_beta1", kSame},
      {"adam_beta2", kHf, "training.adam_beta2", kSame},
      {"adam_epsilon", kHf, "training.adam_eps", kSame},
      {"max_grad_norm", kHf, "training.clip_grad", kSame},
      {"bf16", kHf, "training.precision", "bf16: true is precision: bf16"},
      {"fp16", kHf, "training.precision", "Loom trains in bf16 or fp32, not fp16: precision: bf16"},
      {"seed", kHf, "training.seed", kSame},
      {"output_dir", kHf, "training.output_dir", kSame},
      {"save_steps", kHf, "training.save_every", kSame},
      {"save_total_limit", kHf, "training.keep_last", kSame},
      {"eval_steps", kHf, "training.eval_every", kSame},
      {"logging_steps", kHf, "tools.log_every", kSame},
      {"report_to", kHf, "tools.tensorboard", "report_to: tensorboard is tensorboard: true"},
      {"gradient_checkpointing", kHf, "features.recompute", "true is recompute: full"},
      {"deepspeed", kHf, "parallel.zero", "ZeRO stage 1 or 3 as zero: 1 or 3 (no DeepSpeed JSON)"},
      {"ddp_timeout", kHf, "parallel.timeout_s", kSame},
      {"dataloader_num_workers", kHf, "data.num_workers", kSame},
      {"model_name_or_path", kLf, "model.init_from", "a local model directory"},
      {"cutoff_len", kLf, "data.max_seq_len", kSame},
      {"image_max_pixels", kLf, "data.max_pixels", kSame},
      {"image_min_pixels", kLf, "data.min_pixels", kSame},
      {"freeze_vision_tower", kLf, "model.freeze",
       "true is an entry naming the vision tower's module (`loom shapes --names` lists them)"},
      {"freeze_multi_modal_projector", kLf, "model.freeze",
       "true is an entry naming the projector's module (`loom shapes --names` lists them)"},
      {"freeze_language_model", kLf, "model.freeze",
       "true is an entry naming the language model's module (`loom shapes --names` lists them)"},
      {"dataset", kLf, "data.datasets", "each dataset as an entry {name: NAME}, with data.dataset_info"},
      {"eval_dataset", kLf, "data.eval_datasets",
       "each dataset as an entry {name: NAME}, with data.dataset_info"},
      {"dataset_dir", kLf, "data.dataset_info", "the path of the dataset_info.json in that directory"},
      {"media_dir", kLf, "data.datasets", "the directory as each entry's root"},
      {"video_fps", kLf, "data.video_fps", kSame},
      {"video_maxlen", kLf, "data.video_max_frames", kSame},
      {"video_max_pixels", kLf, "data.video_max_pixels", kSame},
      {"video_min_pixels", kLf, "data.video_min_pixels", kSame},
      {"packing", kLf, "data.packing", kSame},
      {"neat_packing", kLf, "data.packing", "Loom's packing keeps samples apart: packing: true"},
      {"train_on_prompt", kLf, "data.train_on_prompt", kSame},
      {"default_system", kLf, "data.system_prompt", kSame},
      {"preprocessing_num_workers", kLf, "data.num_workers", kSame},
  };
  return table;
}

std::string foreign_key_hint(const std::string& name) {
  for (const ForeignKey& k : foreign_keys())
    if (name == k.name)
      return fmt::format("did you mean {}? ({}'s {}: {})", k.key, k.from, k.name, k.convert);
  return "";
}

}  // namespace loom::config
