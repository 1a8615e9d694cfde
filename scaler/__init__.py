"""leadscale's live KEDA external scaler: signals, the policy, and the gRPC service."""
