"""The real-time sample joiner: raw impression and click events on Kafka -> labelled samples."""
