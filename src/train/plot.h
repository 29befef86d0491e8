// `tiny-qwen3 plot`: train and validation loss against tokens, drawn by gnuplot.
#pragma once
#include <string>

namespace tq::train {

// Reads a --metrics JSONL file (steps and validations) and writes a PNG with gnuplot: the train
// loss per step and the validation loss against tokens trained on. Error for a file that is not
// a metrics log, one with no steps, or when gnuplot is missing or fails; the PNG is written
// atomically.
int plot_command(const std::string& metrics, const std::string& out);

}  // namespace tq::train
