"""Trained weights shipped with the package: the learned tier classifier's
(`tier_default.json.gz`, read by router_policies/tier_classifier_learned.py; trained by
`llm-gateway tiers train`, sources in bench/data/README.md)."""
