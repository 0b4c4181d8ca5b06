#pragma once
// lather-train --model transformer: a character-level transformer on a text (Shakespeare by
// default), data parallel over replicas and tensor parallel over --weight-shards, with the
// optimizers, reductions, accumulation, checkpoints, SIGTERM handling and metrics of the MLP run,
// validation loss at --eval-every, and sampling.

#include "trainer.hpp"

namespace lather::train {

/// Runs one language-model job; collective over `world`. The result's test_loss is the last
/// validation loss (nats per character) and test_accuracy its next-character accuracy.
TrainResult train_language_model(const TrainOptions& options, const comm::Group& world,
                                 const std::function<void(const std::string&)>& log = {});

/// Set by SIGTERM (trainer.cpp's handler): both training loops poll it.
bool termination_requested();

}  // namespace lather::train
