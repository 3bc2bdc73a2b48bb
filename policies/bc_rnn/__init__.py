from .modeling import BCRNNPolicy  # noqa: F401  (registers 'bc_rnn')
