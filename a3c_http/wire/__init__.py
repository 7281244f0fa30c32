"""What crosses the wire: tensors as safetensors bodies, the protocol's header and media-type names,
and the frames our own processes exchange."""
