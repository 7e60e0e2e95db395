// Line plots as PNG files through gnuplot (Debian's gnuplot-nox, installed by
// scripts/setup.sh): the data and the gnuplot script are written next to the
// image (<png without .png>.dat / .gp), so a person can re-plot or tweak it.
//
// Thread-safe: a free function; it runs one gnuplot process per call.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace kvl::training {

struct PlotSeries {
  std::string title;  // legend entry
  std::vector<std::pair<double, double>> points;  // (x, y), in x order
  bool with_points = false;  // sparse series (e.g. validation loss): draw markers
};

struct PlotSpec {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log_y = false;
  int width = 1000, height = 600;  // pixels
  std::vector<PlotSeries> series;
};

// Writes png_path and its .dat/.gp siblings. InvalidArgument when there is
// nothing to plot, FailedPrecondition when gnuplot is not installed or has
// neither the pngcairo nor the png terminal, Internal when gnuplot fails
// (its stderr is in the message).
absl::Status PlotLines(const PlotSpec& spec, const std::string& png_path);

}  // namespace kvl::training
