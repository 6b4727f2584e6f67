"""Services: one use case each, over ports. No boto3 here."""
