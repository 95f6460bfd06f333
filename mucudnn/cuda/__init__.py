"""CUDA runtime through cuda-python: devices, memory, DeviceArray, streams, events."""
