"""The provider kinds, one module each, named as ``provider.kind`` names them.

Each module has ``text_model(config)`` and ``image_model(config)``: the models a project
whose ``provider:`` section names that kind calls. :mod:`resources.providers.provider_kinds`
finds them by name.
"""
