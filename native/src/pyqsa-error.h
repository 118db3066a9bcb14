// Errors that pyqsa's code inside llama_decode reports instead of aborting the process: the
// graph inputs are set on the thread that called llama_decode, so each thread keeps its last
// error until pyqsa_last_error (pyqsa.h) takes it.
#pragma once

// Records an error for the calling thread (printf-style); the first one since the last take
// is kept, later ones until then are dropped.
void pyqsa_error_set(const char * fmt, ...);
