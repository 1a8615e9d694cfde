"""leadscale's simulator: workloads, a vLLM replica model, the KEDA/HPA loop, reports and tuning."""
