// The typed job configuration: one YAML file (sections model, data, parallel, features, training,
// tools) plus --set overrides, loaded into structs and validated strictly; see docs/config.md.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loom/config/keys.h"

namespace loom::config {

// Each section lists its keys once, in keys() (see keys.h): reading, operator==, to_yaml, the
// messages that list valid keys and the key tables of docs/config.md all follow that list. Its
// order is the order keys are read, written and listed in.

// Who reads a key that not every job reads: to_yaml writes the key only for them, and reading refuses
// it for the others when given. Data keys by dataset (fashion_mnist's keys only when set otherwise
// than off: shapes_vqa's job.yaml files have held `hflip: false` and `shift: 0`): messages, every
// built-in set, the built-in image sets, fashion_mnist, the video sets. Model and training keys by task:
// flow_matching, vae.
enum class ReadBy {
  messages,
  files,
  built_in,
  built_in_images,
  fashion_mnist,
  video,
  videos,
  flow_matching,
  vae
};

struct ModelSection {
  std::string family;               // required: a registered family (models/registry.h checks the name)
  std::string hf_config_path;       // model.hf_config given as a string: path to a HF config.json, or a
                                    // published model's name (as loom shapes lists them)
  nlohmann::json hf_config;         // model.hf_config given inline as a YAML mapping, converted to JSON;
                                    // at most one of hf_config_path / hf_config is set; neither: the
                                    // config.json of init_from
  std::string init_from;            // "" or a model directory (HF-style config.json + safetensors)
  std::vector<std::string> freeze;  // module name prefixes to freeze, e.g. [visual]
  // parallel.pp > 1: per tower (visual, llm; dit), how many of its blocks each pipeline stage holds,
  // chunk-major with virtual stages; empty: split by estimated cost (docs/parallelism.md).
  std::map<std::string, std::vector<int64_t>> pipeline_layers;
  // task flow_matching only: the denoiser's frozen helpers.
  std::string vae;                // a latent codec's model directory, or the run directory of a vae job
  nlohmann::json vae_config;      // model.vae inline: the codec's config fields, the weights drawn from
                                  // training.seed (a fixed random codec, for benchmarks)
  std::string text_encoder_path;  // model.text_encoder as a string: a text encoder's model directory
  nlohmann::json text_encoder;    // model.text_encoder inline: its config.json's fields, the weights
                                  // drawn from training.seed (a fixed random encoder, for built-in data)
  // Not a key: training.task, which decides whether vae and text_encoder are read (parse_config and
  // to_yaml take it from the training section).
  std::string task = "vlm_sft";

  bool reads(ReadBy readers) const { return readers == ReadBy::flow_matching && task == "flow_matching"; }

  template <class Keys>
  static void keys(Keys& k) {
    using namespace key;
    using S = ModelSection;
    k("family", &S::family, required("a model family, as `loom shapes` lists them"),
      not_empty("a model family, as `loom shapes` lists them"));
    // Required unless init_from names a model directory (check_rules).
    k("hf_config",
      path_or_mapping(
          &S::hf_config_path, &S::hf_config,
          "a path to a HF config.json, a published model's name or an inline mapping of its fields"),
      not_empty("a path to a HF config.json, a published model's name, or an inline mapping"));
    k("init_from", &S::init_from);
    k("freeze", &S::freeze, no_empty_entry("module prefix"));
    k("pipeline_layers", &S::pipeline_layers);
    k("vae",
      path_or_mapping(&S::vae, &S::vae_config,
                      "a latent codec's model directory, a vae job's run directory or an inline config "
                      "(weights drawn from the seed)"),
      ReadBy::flow_matching,
      required("a latent codec's model directory or a vae job's run directory, or an inline config whose "
               "weights are drawn from the seed"),
      not_empty("a latent codec's model directory, a vae job's run directory or an inline mapping"));
    k("text_encoder",
      path_or_mapping(&S::text_encoder_path, &S::text_encoder,
                      "a text encoder's model directory or an inline config (weights drawn from the seed)"),
      ReadBy::flow_matching,
      required("a text encoder's model directory, or an inline config whose weights are drawn from the seed"),
      not_empty("a text encoder's model directory or an inline mapping"));
  }
};

// One conversation file of data.datasets / data.eval_datasets (dataset: messages).
struct DatasetFile {
  // This or name: JSON array or JSON lines of conversations (messages), or of
  // {"video" or "image": PATH, "caption": TEXT} (videos).
  std::string path;
  std::string root;     // image paths are relative to it; empty = the file's directory
  double weight = 1.0;  // > 0: its share of the mixed training stream
  // Names the file uses instead of its format's defaults, by field: the sample's messages, images,
  // videos, audios, tools, system_prompt, prompt, query, response, history; a message's role and
  // content; the roles user, assistant, system, observation, function.
  std::map<std::string, std::string> fields;
  std::string name;             // messages: this or path: a dataset of data.dataset_info by its name
  std::string format = "auto";  // messages: auto | messages | sharegpt | alpaca

  template <class Keys>
  static void keys(Keys& k) {
    using namespace key;
    using S = DatasetFile;
    k("path", &S::path);
    k("name", &S::name);
    k("root", &S::root);
    k("weight", &S::weight, above(0.0));
    k("format", &S::format, one_of({"auto", "messages", "sharegpt", "alpaca"}));
    k("fields", &S::fields,
      names({"messages", "images", "videos", "audios", "tools", "system_prompt", "prompt", "query",
             "response", "history", "role", "content", "user", "assistant", "system", "observation",
             "function"}),
      not_empty("the key or role name the file uses"));
  }
};

struct DataSection {
  std::string dataset = "shapes_vqa";  // shapes_vqa | fashion_mnist | moving_fashion | messages | videos
  // messages and videos:
  std::vector<DatasetFile> datasets, eval_datasets;  // training mix; held-out files (may be empty)
  // messages only:
  std::string tokenizer;         // HF tokenizer.json or SentencePiece .model
  std::string dataset_info;      // a LLaMA-Factory dataset_info.json: datasets may be named from it
  bool train_on_prompt = false;  // labels on the prompt too, not only replies
  // The system message of a conversation without one: absent, the model's processor's default (e.g.
  // "You are a helpful assistant."); "" for none.
  std::optional<std::string> system_prompt;
  // The image processor's pixel bounds; 0: the model's image processor's own.
  int64_t min_pixels = 0, max_pixels = 0;
  // Conversations' videos: frames taken video_fps a second, at most video_max_frames, each within
  // the video pixel bounds (0: the image bounds).
  double video_fps = 2.0;
  int64_t video_max_frames = 128;
  int64_t video_min_pixels = 0, video_max_pixels = 0;
  // shapes_vqa and fashion_mnist only:
  std::string dir;          // fashion_mnist's files; empty = the Debian package's
  int64_t image_size = 56;  // positive multiple of 28
  bool hflip = false;       // fashion_mnist: mirror each training image left-right with probability 1/2
  int64_t shift = 0;        // fashion_mnist: move each training image by up to this many pixels
  // moving_fashion and videos:
  int64_t video_size = 48;  // the square clip's side in pixels
  int64_t frames = 9;       // frames per clip
  // videos only:
  double fps = 16;  // the rate frames are taken from a video at
  // moving_fashion and videos, for flow_matching: the clips' features as loom data extract-features
  // wrote them into this directory; empty: encoded on the fly
  std::string features;
  // every dataset:
  int64_t eval_samples = 1000;  // > 0, at most the held-out split (shapes_vqa: ShapesVqa::kMaxEvalSamples)
  int64_t eval_max_new_tokens = 64;  // > 0: the longest answer the evaluation decodes
  int64_t max_seq_len = 1024;        // > 0
  std::string overlong = "drop";     // drop | truncate | error: a training sample over max_seq_len
  bool packing = false;              // micro-batches as one padding-free row (cu_seqlens)
  int64_t num_workers = 2;           // 0 to kMaxWorkers
  int64_t prefetch = 4;              // 1 to kMaxPrefetch

  // Bounds on counts that become threads, queue slots or allocations.
  static constexpr int64_t kMaxWorkers = 256, kMaxPrefetch = 4096, kMaxSequence = int64_t{1} << 24;

  bool reads(ReadBy datasets) const;

  // `dataset` comes first: whether the keys after it are read depends on it.
  template <class Keys>
  static void keys(Keys& k) {
    using namespace key;
    using S = DataSection;
    k("dataset", &S::dataset,
      one_of({"shapes_vqa", "fashion_mnist", "moving_fashion", "messages", "videos"}));
    k("tokenizer", &S::tokenizer, ReadBy::messages,
      required("a HuggingFace tokenizer.json or a SentencePiece .model"), not_empty());
    k("datasets", &S::datasets, ReadBy::files,
      required("a list of {path: FILE} conversation or video files to train on"));
    k("eval_datasets", &S::eval_datasets, ReadBy::files);
    k("dataset_info", &S::dataset_info, ReadBy::messages);
    k("train_on_prompt", &S::train_on_prompt, ReadBy::messages);
    k("system_prompt", &S::system_prompt, ReadBy::messages);
    k("min_pixels", &S::min_pixels, ReadBy::messages, at_least(0));
    k("max_pixels", &S::max_pixels, ReadBy::messages, at_least(0),
      at_most(int64_t{89'478'485}));  // decode's kMaxImagePixels
    k("video_fps", &S::video_fps, ReadBy::messages, above(0.0), at_most(1000.0));
    k("video_max_frames", &S::video_max_frames, ReadBy::messages, at_least(int64_t{1}),
      at_most(int64_t{4096}));
    k("video_min_pixels", &S::video_min_pixels, ReadBy::messages, at_least(0));
    k("video_max_pixels", &S::video_max_pixels, ReadBy::messages, at_least(0), at_most(int64_t{89'478'485}));
    k("dir", &S::dir, ReadBy::built_in);
    k("image_size", &S::image_size, ReadBy::built_in_images, at_most(int64_t{4032}));
    k("hflip", &S::hflip, ReadBy::fashion_mnist);
    k("shift", &S::shift, ReadBy::fashion_mnist, at_least(0));
    k("video_size", &S::video_size, ReadBy::video, at_least(int64_t{16}), at_most(int64_t{4096}));
    k("frames", &S::frames, ReadBy::video, at_least(int64_t{1}), at_most(int64_t{4097}));
    k("fps", &S::fps, ReadBy::videos, above(0.0), at_most(1000.0));
    k("features", &S::features, ReadBy::video);
    k("eval_samples", &S::eval_samples, at_least(1));
    k("eval_max_new_tokens", &S::eval_max_new_tokens, at_least(1), at_most(kMaxSequence));
    k("max_seq_len", &S::max_seq_len, at_least(1), at_most(kMaxSequence));
    k("overlong", &S::overlong, one_of({"drop", "truncate", "error"}));
    k("packing", &S::packing);
    k("num_workers", &S::num_workers, at_least(0), at_most(kMaxWorkers));
    k("prefetch", &S::prefetch, at_least(1), at_most(kMaxPrefetch));
  }
};

struct ParallelSection {
  int64_t tp = 1, pp = 1, cp = 1, ep = 1;
  int64_t virtual_stages = 1;              // model chunks per pipeline rank (interleaved 1F1B when > 1)
  std::string pipeline_schedule = "1f1b";  // 1f1b | gpipe
  int64_t dp = 0;                          // >= 1, or 0 for `auto` (world_size / (tp*cp*pp))
  // Context parallelism: the cp ranks form Ulysses groups of cp_ulysses consecutive ranks (an
  // all-to-all trades tokens for heads) and rings across them (ring attention): 1 is a ring of cp
  // ranks, cp is Ulysses alone, between is their hybrid.
  int64_t cp_ulysses = 1;
  // Dynamic context parallelism: each step runs at the smallest degree d dividing cp whose d ranks hold its
  // longest sample within dynamic_cp_tokens tokens each (and that gives every group of d ranks a sample);
  // the dp x cp ranks form dp x cp / d groups, each taking its share of the step's samples. Ulysses
  // runs over gcd(d, cp_ulysses) ranks of a group, the ring across them.
  bool dynamic_cp = false;
  int64_t dynamic_cp_tokens = 0;  // >= 1 with dynamic_cp
  bool sequence_parallel = false;
  int64_t vision_tp = 0;  // the vision tower's tp: 1 (whole on every tp rank) or tp; 0 = tp
  int64_t zero = 0;       // 0, 1 or 3
  // ep > 1: hot-expert replication (parallel/expert.h ExpertExchange): when the rows an ep rank would
  // compute in a MoE layer are over this many times the ranks' mean, its hottest expert is copied for
  // the pass to the least loaded rank with part of its rows; 0: never.
  double hot_expert_threshold = 0.0;
  int64_t timeout_s = 300;  // a collective or the rendezvous waits this long for the other ranks; >= 1
  // Every rank fails this long after another rank's heartbeat stopped (a stopped or hung process),
  // whatever collective it waits in; >= 3.
  int64_t heartbeat_timeout_s = 60;
  int64_t bucket_mb = 25;           // gradients are summed over the ranks in flat buckets of this size; >= 1
  bool overlap_grad_reduce = true;  // start each bucket's all-reduce during backward, once it is ready
  // zero=3 (FSDP): the blocks sharded as units of their own, as module paths whose parts may be {*}
  // (any index) or {a-b} (a range), e.g. model.layers.{*}; empty: every vision and LLM block.
  std::vector<std::string> fsdp_plan;

  static constexpr int64_t kMaxTimeout = 7 * 24 * 3600;  // a week, in seconds: far from any overflow in ms

  template <class Keys>
  static void keys(Keys& k) {
    using namespace key;
    using S = ParallelSection;
    k("tp", &S::tp, at_least(1));
    k("pp", &S::pp, at_least(1));
    k("virtual_stages", &S::virtual_stages, at_least(1), at_most(int64_t{1024}));
    k("pipeline_schedule", &S::pipeline_schedule, one_of({"1f1b", "gpipe"}));
    k("cp", &S::cp, at_least(1));
    k("cp_ulysses", &S::cp_ulysses, at_least(1));
    k("dynamic_cp", &S::dynamic_cp);
    k("dynamic_cp_tokens", &S::dynamic_cp_tokens, at_least(0));
    k("ep", &S::ep, at_least(1));
    k("dp", &S::dp, integer_or_auto());
    k("sequence_parallel", &S::sequence_parallel);
    k("vision_tp", &S::vision_tp);
    k("zero", &S::zero, one_of({0, 1, 3}));
    k("hot_expert_threshold", &S::hot_expert_threshold, at_least(0.0));
    k("timeout_s", &S::timeout_s, at_least(1), at_most(kMaxTimeout));
    k("heartbeat_timeout_s", &S::heartbeat_timeout_s, at_least(3), at_most(kMaxTimeout));
    k("bucket_mb", &S::bucket_mb, at_least(1), at_most(int64_t{1} << 20));
    k("overlap_grad_reduce", &S::overlap_grad_reduce);
    k("fsdp_plan", &S::fsdp_plan, no_empty_entry("module path"));
  }
};

struct FeaturesSection {
  // none | full: each recomputed block keeps only its inputs and runs its forward again in backward.
  std::string recompute = "none";
  int64_t recompute_layers = 0;  // the first this many blocks of each stage; 0: every block
  bool fused_kernels = true;     // Loom's fused CPU kernels (flash attention) instead of composites
  // With recompute full: the recomputed blocks' inputs go to a spill file after their forward and
  // come back one block ahead in backward.
  bool offload = false;
  // bf16 training: each parameter's fp32 master weight is the bf16 parameter plus a 16-bit residual
  // (2 bytes per parameter less optimizer state, the same updates bit for bit).
  bool reuse_fp32_param = false;
  // Under pipeline parallelism: the warm-up micro-batches keep only their inputs and are run again in
  // the idle time before their backward (parallel/pipeline/order.h).
  bool recompute_in_bubbles = false;

  template <class Keys>
  static void keys(Keys& k) {
    using namespace key;
    using S = FeaturesSection;
    k("recompute", &S::recompute, one_of({"none", "full", "selective"}));
    k("recompute_layers", &S::recompute_layers, at_least(0));
    k("fused_kernels", &S::fused_kernels);
    k("offload", &S::offload);
    k("reuse_fp32_param", &S::reuse_fp32_param);
    k("recompute_in_bubbles", &S::recompute_in_bubbles);
  }
};

struct TrainingSection {
  int64_t steps = 0;  // > 0, or 0 with epochs given (tasks/registry.h resolve_steps)
  double epochs = 0;  // > 0: passes over the training data instead of steps; 0: steps given
  int64_t global_batch_size = 32, micro_batch_size = 8;
  double lr = 1e-3, min_lr = 0.0;
  int64_t warmup_steps = 0;
  double weight_decay = 0.0;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8;
  double clip_grad = 1.0;          // 0 = off
  std::string precision = "fp32";  // fp32 | bf16
  // Where the job trains: cpu, or cuda (each rank on the GPU of its local rank; a build against a
  // CUDA libtorch). allow_tf32: CUDA's fp32 matrix products and convolutions on TF32 tensor cores
  // (10-bit mantissas; off: fp32 jobs compute in full fp32, as on the CPU).
  std::string device = "cpu";  // cpu | cuda
  bool allow_tf32 = false;
  int64_t seed = 1234;
  // What the job trains: its step data, loss and evaluation. vlm_sft: chat-template supervised
  // fine-tuning of a vision-language model, evaluated by VQA exact match.
  std::string task = "vlm_sft";
  // task flow_matching: the noise level s of each training sample, drawn uniform or logit-normal
  // (sigmoid of N(logit_mean, logit_std^2)) and shifted by the timestep shift, s' = shift s / (1 +
  // (shift - 1) s); a caption replaced by the empty prompt's with probability caption_dropout (so the
  // model learns the unconditional velocity classifier-free guidance needs).
  double flow_shift = 3.0;
  std::string timestep_sampling = "logit_normal";  // uniform | logit_normal
  double logit_mean = 0.0, logit_std = 1.0;
  double caption_dropout = 0.1;  // [0, 1)
  // Sampling held-out captions (the evaluation) and loom generate's defaults.
  std::string sample_solver = "dpm++";  // euler | dpm++ | unipc
  int64_t sample_steps = 25;
  double sample_guidance = 5.0, sample_shift = 3.0;
  // Held-out captions sampled (flow_matching) or clips reconstructed (vae) at each evaluation.
  int64_t eval_videos = 4;
  // task vae: the loss per pixel is the reconstruction error (squared, or absolute for l1) plus
  // kl_weight x the KL divergence of the posterior from N(0, I), summed over the latent elements, per pixel.
  std::string reconstruction_loss = "mse";  // mse | l1
  double kl_weight = 1e-4;
  std::string output_dir = "runs/default";
  int64_t save_every = 0;       // 0 = save only at the end
  int64_t keep_last = 2;        // >= 1
  int64_t eval_every = 0;       // 0 = evaluate only at the end
  std::string resume = "auto";  // auto | none | a checkpoint directory
  int64_t threads = 0;          // 0 = all cores
  double peak_tflops = 0.0;     // 0 = use the measured sgemm rate for MFU
  int64_t exit_interval = 0;    // > 0: save and exit at a step divisible by it (splits a run into jobs)
  // A step whose loss or gradient norm is NaN or infinite stops training, unless this many such
  // steps may be skipped (no update; counted and logged).
  int64_t skip_nonfinite_steps = 0;
  // A mixture of experts' routing (docs/parallelism.md "Expert load"; refused for a dense model):
  // - moe_capacity_factor > 0: each expert computes at most ceil(factor * T * k / E) picks of a
  //   micro-batch's T tokens on a rank (those of highest routing probability); the others are
  //   dropped, and counted as expert_dropped. 0: dropless.
  // - moe_z_loss: the router z-loss's coefficient; the loss adds coef * the mean over tokens of
  //   logsumexp(router logits)^2, summed over the MoE layers.
  // - moe_expert_bias_rate > 0: the auxiliary-loss-free balance: each layer picks experts by routing
  //   probability plus a per-expert bias (weighted by the probabilities alone), and after each step
  //   every bias moves by this rate towards balance: + for an expert with fewer picks than the mean,
  //   - for more.
  double moe_capacity_factor = 0.0, moe_z_loss = 0.0, moe_expert_bias_rate = 0.0;

  // Bounds on counts that become allocations or threads (the thread count is further held to a
  // multiple of the machine's cores, with a warning).
  static constexpr int64_t kMaxBatchSize = int64_t{1} << 20, kMaxThreads = 4096;

  bool reads(ReadBy readers) const {
    return (readers == ReadBy::flow_matching && task == "flow_matching") ||
           (readers == ReadBy::vae && task == "vae") ||
           (readers == ReadBy::video && (task == "flow_matching" || task == "vae"));
  }

  template <class Keys>
  static void keys(Keys& k) {
    using namespace key;
    using S = TrainingSection;
    k("steps", &S::steps, at_least(0));
    k("epochs", &S::epochs, at_least(0.0));
    k("global_batch_size", &S::global_batch_size, at_least(1), at_most(kMaxBatchSize));
    k("micro_batch_size", &S::micro_batch_size, at_least(1), at_most(kMaxBatchSize));
    k("lr", &S::lr, above(0.0));
    k("min_lr", &S::min_lr, at_least(0.0));
    k("warmup_steps", &S::warmup_steps, at_least(0));
    k("weight_decay", &S::weight_decay, at_least(0.0));
    k("adam_beta1", &S::adam_beta1, in_unit_interval());
    k("adam_beta2", &S::adam_beta2, in_unit_interval());
    k("adam_eps", &S::adam_eps, above(0.0));
    k("clip_grad", &S::clip_grad, at_least(0.0));
    k("precision", &S::precision, one_of({"fp32", "bf16"}));
    k("device", &S::device, one_of({"cpu", "cuda"}));
    k("allow_tf32", &S::allow_tf32);
    k("seed", &S::seed, at_least(0));
    // The task is a training key, not a top-level one: the file stays sections only, so it is
    // `training.task` in messages and --set like every key, and it is what training optimises
    // (supervised fine-tuning now; preference and diffusion objectives later).
    k("task", &S::task, one_of({"vlm_sft", "flow_matching", "vae"}));
    k("flow_shift", &S::flow_shift, ReadBy::flow_matching, above(0.0));
    k("timestep_sampling", &S::timestep_sampling, ReadBy::flow_matching, one_of({"uniform", "logit_normal"}));
    k("logit_mean", &S::logit_mean, ReadBy::flow_matching);
    k("logit_std", &S::logit_std, ReadBy::flow_matching, above(0.0));
    k("caption_dropout", &S::caption_dropout, ReadBy::flow_matching, in_unit_interval());
    k("sample_solver", &S::sample_solver, ReadBy::flow_matching, one_of({"euler", "dpm++", "unipc"}));
    k("sample_steps", &S::sample_steps, ReadBy::flow_matching, at_least(int64_t{1}), at_most(int64_t{1000}));
    k("sample_guidance", &S::sample_guidance, ReadBy::flow_matching, at_least(0.0));
    k("sample_shift", &S::sample_shift, ReadBy::flow_matching, above(0.0));
    k("eval_videos", &S::eval_videos, ReadBy::video, at_least(int64_t{0}), at_most(int64_t{1000}));
    k("reconstruction_loss", &S::reconstruction_loss, ReadBy::vae, one_of({"mse", "l1"}));
    k("kl_weight", &S::kl_weight, ReadBy::vae, at_least(0.0));
    k("output_dir", &S::output_dir, not_empty("a directory for checkpoints and logs"));
    k("save_every", &S::save_every, at_least(0));
    k("keep_last", &S::keep_last, at_least(1), at_most(int64_t{1} << 30));
    k("eval_every", &S::eval_every, at_least(0));
    k("resume", &S::resume, not_empty("auto, none or a checkpoint directory"));
    k("threads", &S::threads, at_least(0), at_most(kMaxThreads));
    k("peak_tflops", &S::peak_tflops, at_least(0.0));
    k("exit_interval", &S::exit_interval, at_least(0));
    k("skip_nonfinite_steps", &S::skip_nonfinite_steps, at_least(0));
    k("moe_capacity_factor", &S::moe_capacity_factor, at_least(0.0));
    k("moe_z_loss", &S::moe_z_loss, at_least(0.0));
    k("moe_expert_bias_rate", &S::moe_expert_bias_rate, at_least(0.0));
  }
};

struct ToolsSection {
  int64_t log_every = 10;          // >= 1
  std::string log_level = "info";  // trace | debug | info | warn | error
  bool progress_bar = true;
  // > 0: after this step's backward, rank 0 writes every trainable parameter's gradient, summed
  // over the ranks and whole (before clipping), to <output_dir>/gradients/step-NNNNNNNN.safetensors.
  int64_t dump_gradients = 0;
  // Rank 0 also writes every metrics.jsonl record as TensorBoard scalars, one event file per run
  // under <output_dir>/tensorboard/.
  bool tensorboard = false;

  template <class Keys>
  static void keys(Keys& k) {
    using namespace key;
    using S = ToolsSection;
    k("log_every", &S::log_every, at_least(1));
    k("log_level", &S::log_level, one_of({"trace", "debug", "info", "warn", "error"}));
    k("progress_bar", &S::progress_bar);
    k("dump_gradients", &S::dump_gradients, at_least(0));
    k("tensorboard", &S::tensorboard);
  }
};

struct JobConfig {
  ModelSection model;
  DataSection data;
  ParallelSection parallel;
  FeaturesSection features;
  TrainingSection training;
  ToolsSection tools;
  std::string source;  // file name, used in messages; not a key

  // The sections: the top-level keys of a job file.
  template <class Keys>
  static void keys(Keys& k) {
    using J = JobConfig;
    k("model", &J::model);
    k("data", &J::data);
    k("parallel", &J::parallel);
    k("features", &J::features);
    k("training", &J::training);
    k("tools", &J::tools);
  }
};

// Equality of every value; JobConfig's `source` is not compared.
bool operator==(const ModelSection& a, const ModelSection& b);
bool operator==(const DatasetFile& a, const DatasetFile& b);
bool operator==(const DataSection& a, const DataSection& b);
bool operator==(const ParallelSection& a, const ParallelSection& b);
bool operator==(const FeaturesSection& a, const FeaturesSection& b);
bool operator==(const TrainingSection& a, const TrainingSection& b);
bool operator==(const ToolsSection& a, const ToolsSection& b);
bool operator==(const JobConfig& a, const JobConfig& b);
inline bool operator!=(const JobConfig& a, const JobConfig& b) { return !(a == b); }

// Reads the YAML file at `path`, applies each `key=value` override in order, types and validates.
// Throws loom::ConfigError naming the file (or the --set), the dotted key, the value and what is valid.
JobConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// The same from YAML text; `source` names it in messages. Touches no file.
JobConfig parse_config(const std::string& yaml_text, const std::string& source,
                       const std::vector<std::string>& overrides = {});

// Every key written out; parse_config(to_yaml(c), ...) == c.
std::string to_yaml(const JobConfig& config);

// The key tables docs/config.md must hold: for each section (model, ...) and each list of mappings
// in one (data.datasets, data.eval_datasets), the keys declared there, in order.
std::vector<std::pair<std::string, std::vector<std::string>>> declared_keys();

// The model sizes the parallel layout must fit.
struct ModelDims {
  int64_t llm_heads, llm_kv_heads, vision_heads, vocab_size, llm_layers;
  int64_t blocks = 0;   // every tower's blocks, what pipeline stages are cut from (0: llm_layers)
  int64_t experts = 0;  // a mixture of experts' experts per layer (0: none), what parallel.ep splits
};

// Checks the parallel layout against the model and the world size (heads, kv heads, vocab and layers
// split evenly, tp*cp*pp*dp == world_size, global batch divisible by micro*dp, at least one block per
// pipeline stage and, interleaved, whole groups of pp micro-batches), then refuses every
// parallelism this build cannot run. Throws loom::ConfigError.
void validate_parallel(const JobConfig& config, const ModelDims& dims, int64_t world_size);

// parallel.dp resolved: the configured value, or world_size / (tp*cp*pp) for `auto`.
int64_t data_parallel_size(const ParallelSection& parallel, int64_t world_size);

}  // namespace loom::config
