"""gRPC clients the server uses to reach the model services."""
