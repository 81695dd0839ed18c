"""Pure TensorFlow math: no TFF import, usable and testable from any runtime."""
