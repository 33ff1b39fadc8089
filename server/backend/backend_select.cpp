// placeholder: backend selection (auto|cuda|sim) lands with the daemon
