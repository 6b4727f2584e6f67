"""Running without AWS: moto's server, the Lambda seam, the twin."""
