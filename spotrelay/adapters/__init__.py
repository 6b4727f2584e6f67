"""Adapters: the only modules that import boto3."""
