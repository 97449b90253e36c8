"""An attempt's lifecycle: admission, the attempt engine and its outcomes, streams, the request pipeline."""
