// A one-line text progress bar for stderr/stdout on a terminal ("[=========>          ] 45%"), shared by the
// commands that show progress (`coc analyze` on big traces; the trainer's bar has the same look).
#pragma once

#include <cstdint>
#include <string>

namespace coc {

/// The bar for `done` of `total` units, `width` characters between the brackets (total ≤ 0 draws a full bar).
/// Pure; the caller decides where to print it and how often (redraw with "\r\033[K").
std::string progress_bar(int64_t done, int64_t total, int width = 30);

/// True when file descriptor `fd` is a terminal and TERM is not "dumb": progress bars and colours are only drawn
/// then, so logs and pipes get clean text. In an MPI rank, COC_STDOUT_IS_TTY (set by scripts/launch) decides when
/// set; under Open MPI without it the answer is false (its ranks' pseudo-terminals say nothing about mpirun's).
bool is_terminal(int fd);

}  // namespace coc
