"""heatinv: differentiable LRP for Keras 3 and its inverse problem."""
