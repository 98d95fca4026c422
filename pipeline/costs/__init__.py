"""What a profile will cost before it runs (``python -m pipeline.forecast``): training throughput measured on a device
(``throughput``), the rates and the model a trial is priced with (``rates``), trials handed to a cluster's slots
(``schedule``), and the forecast (``prediction``)."""
