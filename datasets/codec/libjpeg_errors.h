// datasets/codec/libjpeg_errors.h (build-only): how the codec meets libjpeg's errors, for the
// decoder and the encoder alike.
//
// libjpeg reports an error by calling error_exit, which must not return; on_error formats the
// message into the ErrorManager and longjmps to the setjmp of the call that started the work.
// Corrupt data (a truncated file, a bad Huffman code) is only a warning to libjpeg, which then
// carries on with grey pixels; on_message makes it the error it is.
// Requires: the frame that called setjmp holds nothing with a destructor (the jump skips them).
#pragma once

#include <csetjmp>
#include <cstdio>

// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>

namespace conveyor::detail {

struct ErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] inline void on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

inline void on_message(j_common_ptr cinfo, int level) {
  if (level < 0) on_error(cinfo);
}

}  // namespace conveyor::detail
