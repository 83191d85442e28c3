# The core module tutti._tutti (import tutti).
