"""The restore pipeline behind :meth:`Checkpointer.restore`: ``decode`` reads and decodes the chains of frames of
one shard, ``merge`` checks the shapes of and loads into the ``into=`` objects, ``restore`` picks the
checkpoint (falling back to an older intact one when asked) and the shard of this rank."""
