// Pipeline schedules as orders: what one pipeline rank does in a step, in turn. A rank of `stages`
// holds `virtual_stages` model chunks; chunk c on rank r is global stage c * stages + r, so the
// carry goes rank 0, 1, ..., stages - 1, back to rank 0 for the next chunk, and so on. Every
// forward of a global stage other than the first receives its input from the stage before, every
// forward of a stage other than the last sends its output on; backward goes the other way. The
// orders are plain data, so each schedule is tested alone against a hand-written table and
// simulated over every rank at once (tests/unit/parallel/pipeline_order_test.cpp); the trainer's
// executor (train/forward_backward.h) runs them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace loom::parallel::pipeline {

struct Shape {
  int64_t stages = 1;          // pipeline ranks (parallel.pp)
  int64_t virtual_stages = 1;  // model chunks per rank (parallel.virtual_stages)
  int64_t micro_batches = 1;   // this step's, the same on every rank of the pipeline

  int64_t global_stages() const { return stages * virtual_stages; }
};

struct Action {
  enum class Kind {
    receive_forward,   // wait for the input of (micro_batch, chunk) from the stage before
    forward,           // run the chunk's forward on it
    send_forward,      // start sending its output to the stage after
    receive_backward,  // wait for the gradient of that output from the stage after
    backward,          // run the chunk's backward
    send_backward,     // start sending the input's gradient to the stage before
    recompute,         // run the chunk's forward again, its first run having kept only its input
  };
  Kind kind;
  int64_t micro_batch;
  int64_t chunk;

  bool operator==(const Action& other) const {
    return kind == other.kind && micro_batch == other.micro_batch && chunk == other.chunk;
  }
};

// All forwards in turn, then all backwards (GPipe): every micro-batch's activations live at once.
// The reference the others are checked against.
std::vector<Action> gpipe_order(const Shape& shape, int64_t rank);
// One forward, one backward (PipeDream-flush / Megatron's 1F1B): stages - rank - 1 warm-up
// forwards, then a forward and a backward in turn, then the remaining backwards; a rank holds at
// most stages - rank micro-batches' activations. With virtual stages, the interleaved form:
// micro-batches go through the chunks in groups of `stages` (each group through chunk 0, then chunk
// 1, ...), with (stages - rank - 1) * 2 + (virtual_stages - 1) * stages warm-up forwards; the
// micro-batches must then be a multiple of `stages` (ConfigError otherwise: a partial last group
// can leave two ranks waiting on each other).
std::vector<Action> one_f_one_b_order(const Shape& shape, int64_t rank);

// Recompute in the bubbles (MindSpeed MM's independent recompute scheduling): the warm-up forwards
// (every forward before the rank's first backward receive but the last, never the last stage's) keep
// only their input once their output is sent, and each is run again just before the receive of its
// output's gradient, while the stages after it work out that gradient: memory the warm-up held
// through the pipeline's fill, for compute done where the rank would wait.
std::vector<Action> recompute_in_bubbles(const std::vector<Action>& order, const Shape& shape, int64_t rank);

// "rF0 F0 sF0 ..." (r receive, s send, F forward, B backward, R recompute; ".c" after the micro-batch
// for chunk c when there are virtual stages): how tests and messages write an order.
std::string describe(const std::vector<Action>& order, const Shape& shape);

// The global stage of `chunk` on `rank`, and whether it is the first or the last.
inline int64_t global_stage(const Shape& shape, int64_t rank, int64_t chunk) {
  return chunk * shape.stages + rank;
}

}  // namespace loom::parallel::pipeline
