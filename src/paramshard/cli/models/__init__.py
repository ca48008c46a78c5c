"""The commands about a trained model: export, export-model, predict."""
