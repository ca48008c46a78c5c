"""Using a trained model: model files, loading without servers, evaluation, `paramshard predict`."""
