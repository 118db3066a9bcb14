"""Build support (standard library only): pinned upstream, patch series, CMake build."""
