"""Generated from protos/externalscaler.proto by scaler.protogen; do not edit."""
