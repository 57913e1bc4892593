"""The HTTP gateway: HTTP/JSON -> gRPC for every route annotated in the protos."""
