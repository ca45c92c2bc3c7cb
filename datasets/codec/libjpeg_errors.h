// datasets/codec/libjpeg_errors.h (build-only): how the codec meets libjpeg's errors, for the
// decoder and the encoder alike.
//
// libjpeg reports an error by calling error_exit, which must not return; on_error formats the
// message into the ErrorManager and longjmps to the setjmp of the call that started the work.
// Corrupt data (a truncated file, a bad Huffman code) is only a warning to libjpeg, which then
// carries on with grey pixels; on_message makes it the error it is.
// No C++ exception ever crosses libjpeg's C frames: libjpeg's errors and the codec's own checks
// inside its callbacks (fail_with: the progress monitor's scan limit; the own entropy decoder's
// refusal midway through a scan, jpeg_column_discard.h; the encoder's destination, which catches
// its allocation failures) all longjmp back to that setjmp, and the frame that called setjmp
// throws (or, after the own decoder's refusal, decodes again) once libjpeg has returned.
// Requires: the frame that called setjmp holds nothing with a destructor (the jump skips them),
// and no jump leaves a catch block (the exception being handled would never be released).
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

// Ends the libjpeg call in progress with `text` as its message, as on_error does with libjpeg's
// own: for checks made inside libjpeg's callbacks.
[[noreturn]] inline void fail_with(j_common_ptr cinfo, const char* text) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  std::snprintf(err->message, sizeof err->message, "%s", text);
  std::longjmp(err->jump, 1);
}

inline void on_message(j_common_ptr cinfo, int level) {
  if (level < 0) on_error(cinfo);
}

}  // namespace conveyor::detail
