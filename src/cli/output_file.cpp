#include "cli/output_file.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "coc/core/error.h"

namespace coc::cli {

namespace fs = std::filesystem;

void write_atomically(const std::string& path, const std::string& text) {
  std::error_code dir_ec;
  if (fs::is_directory(path, dir_ec))
    throw_invalid("cannot write the report to {}: it is a directory; pass a file name such as {}/report", path,
                  path);
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw_error(ErrorKind::kIo, "cannot write {}: {}; check that its folder exists and is writable", path,
                        std::strerror(errno));
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    f.close();
    if (!f) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw_error(ErrorKind::kIo, "cannot write {} (disk full?)", path);
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    throw_error(ErrorKind::kIo, "cannot rename {} to {}: {}", tmp, path, why);
  }
}

}  // namespace coc::cli
