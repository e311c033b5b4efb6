"""The composition root: :func:`~.app.create_app`, which builds every binding with explicit
arguments and starts and stops the Field's parts, handing them to the bindings' runtime
(:class:`~field.transports.runtime.Runtime`) at once; the configuration ``field serve``
reads once; and the uvicorn server it runs."""
