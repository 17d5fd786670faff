"""Any torch.nn.Module traced on the meta device: every aten op with its FLOPs and bytes."""
