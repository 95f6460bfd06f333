"""Raw ctypes binding to libcudnn: loader, prototypes, enums, errors, handles and descriptors."""
