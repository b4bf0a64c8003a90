# ruff: noqa: E501, RUF001
"""Writes ``tier_eval.jsonl``: the labelled easy/hard prompt set described in README.md.

Data as code: every prompt is written out below, grouped by category. Each label was decided
per prompt, by the rule in README.md, before any classifier score was looked at. The set was
written after the default ``TierWeights`` were chosen and is not used to fit them.

Regenerate with ``python router_policies/data/make_tier_eval.py`` (deterministic output).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Body = dict[str, Any]
E = "easy"
H = "hard"


def ask(
    text: str,
    *,
    system: str | None = None,
    history: Sequence[tuple[str, str]] = (),
    max_tokens: int | None = None,
    tools: list[Body] | None = None,
    response_format: Body | None = None,
) -> Body:
    """An OpenAI chat/completions body: optional system prompt, earlier (user, assistant)
    turns, then the user message ``text``."""
    messages: list[Body] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    for user, assistant in history:
        messages.append({"role": "user", "content": user})
        messages.append({"role": "assistant", "content": assistant})
    messages.append({"role": "user", "content": text})
    body: Body = {"model": "auto", "messages": messages}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if tools is not None:
        body["tools"] = tools
    if response_format is not None:
        body["response_format"] = response_format
    return body


def tool(name: str, description: str, **params: str) -> Body:
    """A function tool whose parameters are all required strings (descriptions as values)."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {p: {"type": "string", "description": d} for p, d in params.items()},
                "required": list(params),
            },
        },
    }


def json_schema(name: str, properties: Body) -> Body:
    return {
        "type": "json_schema",
        "json_schema": {
            "name": name,
            "strict": True,
            "schema": {
                "type": "object",
                "properties": properties,
                "required": list(properties),
                "additionalProperties": False,
            },
        },
    }


JSON_OBJECT: Body = {"type": "json_object"}
STR: Body = {"type": "string"}
STR_LIST: Body = {"type": "array", "items": {"type": "string"}}

ORDER_TOOLS = [
    tool("get_order_status", "Look up an order by its number.", order_id="The order number"),
    tool("start_return", "Open a return for an order.", order_id="The order number", reason="Why"),
]
WEATHER_TOOL = [
    tool("get_weather", "Forecast for a city and date.", city="City name", date="ISO date"),
]
EMAIL_TOOL = [
    tool("send_email", "Send an email.", to="Recipient", subject="Subject", body="Body text"),
]
CALENDAR_TOOLS = [
    tool(
        "find_free_slots",
        "Free slots for attendees.",
        attendees="Comma-separated emails",
        start="ISO datetime",
        end="ISO datetime",
    ),
    tool(
        "create_event",
        "Create a calendar event.",
        title="Title",
        start="ISO datetime",
        end="ISO datetime",
        attendees="Comma-separated emails",
    ),
    *EMAIL_TOOL,
]
RESTAURANT_TOOLS = [
    tool(
        "book_table",
        "Reserve a table.",
        restaurant="Name",
        party_size="Guests",
        time="ISO datetime",
    ),
]
CURRENCY_TOOL = [
    tool(
        "convert_currency",
        "Convert an amount.",
        amount="Amount",
        source="ISO code",
        target="ISO code",
    ),
]
SQL_TOOLS = [
    tool("run_sql", "Run a read-only SQL query on the analytics warehouse.", query="SQL text"),
    tool("describe_table", "Columns and types of a table.", table="Table name"),
]
TRAVEL_TOOLS = [
    tool("search_flights", "Search flights.", origin="IATA", destination="IATA", date="ISO date"),
    tool("search_hotels", "Search hotels.", city="City", check_in="ISO date", check_out="ISO date"),
    tool("book", "Book a flight or hotel offer.", offer_id="Offer id from a search"),
]
SHELL_TOOLS = [
    tool("run_shell", "Run a shell command in the repository sandbox.", command="Command line"),
    tool("read_file", "Read a file from the repository.", path="Path"),
    tool("write_file", "Overwrite a file.", path="Path", content="New content"),
]


# --------------------------------------------------------------------------------------------
# Easy: small talk, everyday facts, advice.
# --------------------------------------------------------------------------------------------

KIDS_APP = "You are Sunny, a friendly assistant in a children's learning app. Keep answers short, kind and cheerful."

SMALL_TALK = [
    (E, ask("hi!")),
    (E, ask("Good morning! How are you today?")),
    (E, ask("thanks, that was really helpful :)")),
    (E, ask("What's your name?")),
    (E, ask("tell me a joke about cats")),
    (
        E,
        ask(
            "I'm bored. Any ideas for something fun to do this evening? I'm home alone and it's raining."
        ),
    ),
    (
        E,
        ask(
            "just wanted to chat honestly. had a really long day at work and my boss was in a mood",
            history=[("hey", "Hey! How's it going? Anything I can help with?")],
        ),
    ),
    (
        E,
        ask(
            "What should I name my new golden retriever puppy? She's super fluffy and a bit goofy."
        ),
    ),
    (
        E,
        ask(
            "Write a fun happy birthday message for my sister Anna, she's turning 30 and loves karaoke"
        ),
    ),
    (
        E,
        ask(
            "lol ok. goodnight!",
            history=[
                (
                    "what's a good podcast to fall asleep to",
                    "Something calm works best, like a slow history or nature podcast. Want a few names?",
                ),
                ("nah I'll find one", "Sounds good! Sleep well."),
            ],
        ),
    ),
    (E, ask("Do you like music?")),
    (E, ask("Give me a motivational quote to start my Monday")),
    (E, ask("I just got the job!!! 🎉🎉")),
    (E, ask("whats ur favorite animal", system=KIDS_APP)),
    (E, ask("Can you recommend a good sci-fi book for a 14 year old who liked The Hunger Games?")),
    (E, ask("what's a fun fact I can tell at dinner tonight?", max_tokens=100)),
]

TRIVIA = [
    (E, ask("What is the capital of Australia?")),
    (E, ask("Who wrote Pride and Prejudice?")),
    (E, ask("How many planets are in our solar system?")),
    (E, ask("What's the boiling point of water in Fahrenheit?")),
    (E, ask("When did World War II end?")),
    (E, ask("What does DNA stand for?")),
    (E, ask("Which ocean is the largest?")),
    (E, ask("Who painted the Mona Lisa?")),
    (E, ask("what language do they speak in brazil")),
    (E, ask("How many bones are in the adult human body?")),
    (E, ask("What's the chemical symbol for gold?")),
    (E, ask("Who was the first person to walk on the moon, and in what year?")),
    (E, ask("what year did the berlin wall fall")),
    (E, ask("What's the difference between a virus and a bacterium? Keep it short.")),
    (E, ask("What is photosynthesis? Explain it like I'm 10.")),
    (E, ask("How many players does a soccer team have on the field?")),
    (E, ask("What currency do they use in Japan?")),
    (E, ask("Is a tomato a fruit or a vegetable?")),
    (E, ask("Why is the sky blue?")),
    (E, ask("Explain why leaves change colour in autumn.")),
    (E, ask("Roughly how many people live in Canada?")),
    (E, ask("What does HTTP stand for?")),
    (E, ask("Which planet is known as the Red Planet?")),
    (E, ask("What is the longest river in Africa?")),
    (E, ask("Who invented the telephone?", max_tokens=64)),
    (E, ask("What's the speed of light, approximately, in km per second?")),
]

ADVICE = [
    (E, ask("How do I get red wine out of a white cotton shirt?")),
    (E, ask("Any tips for falling asleep faster? I keep lying awake for an hour.")),
    (E, ask("How long should I boil an egg for a runny yolk?")),
    (E, ask("What should I pack for a weekend hiking trip in the mountains in September?")),
    (
        E,
        ask(
            "How do I politely decline a meeting invitation from a coworker without sounding rude?"
        ),
    ),
    (E, ask("What's a good beginner workout routine if I can only go to the gym 3 days a week?")),
    (E, ask("How often should I water a snake plant?")),
    (
        E,
        ask(
            "Compare the iPhone and Android phones for my 78-year-old grandma. Which one is easier for her?"
        ),
    ),
    (
        E,
        ask(
            "Plan a simple 3-day itinerary for a first trip to Rome. We like food and history, not museums all day."
        ),
    ),
    (
        E,
        ask(
            "What are the pros and cons of renting vs buying a house? Just the general picture, I'm in my 20s."
        ),
    ),
    (E, ask("Briefly, what's the difference between a Roth IRA and a traditional IRA?")),
    (E, ask("My sourdough starter smells like nail polish remover. Is it dead?")),
    (E, ask("How do I ask my manager for a raise? Give me a short script I can adapt.")),
]


# --------------------------------------------------------------------------------------------
# Easy: customer support (system prompts, tools, several turns, one long angry message).
# --------------------------------------------------------------------------------------------

ISP_SUPPORT = "You are the support assistant for Brightline Internet. Be polite and concise. Escalate billing disputes to a human agent by telling the customer you are transferring them."

SHOP_SUPPORT = """You are the customer service assistant for Nordhaus Home, an online homeware shop.

Policies you must follow:
- Shipping: we ship to all EU countries, the UK, Norway and Switzerland. Standard delivery takes 3-5 working days (EU) and 5-8 working days (UK, Norway, Switzerland). Customers outside the EU may pay import duties on delivery.
- Returns: unused items can be returned within 30 days of delivery for a full refund. Opened items can be returned within 14 days if they are in resaleable condition; a 10% restocking fee applies. Mattresses and bedding cannot be returned once the seal is broken, for hygiene reasons.
- Refunds are issued to the original payment method within 5 working days of us receiving the return.
- Order changes: the delivery address can be changed until the order status is "packed". After that, the customer must contact the carrier.
- Opening hours of the phone line: Monday to Friday 8:00-18:00 CET, Saturday 9:00-13:00 CET, closed on Sundays and public holidays.
- Never promise compensation. For damaged goods, ask for a photo and open a return with reason "damaged".
"""

BANK_SUPPORT = "You are the virtual assistant of Kestrel Bank. You may explain products and procedures. Never ask for full card numbers, PINs or passwords."

AIRLINE_SUPPORT = """You are the assistant of SkyBridge Airlines. Under EU regulation 261/2004, for cancellations notified less than 14 days before departure passengers may choose a refund or rebooking on the next available flight, and may be entitled to compensation of 250 EUR (up to 1500 km), 400 EUR (1500-3500 km) or 600 EUR (above 3500 km) unless the cancellation was caused by extraordinary circumstances. Rebooking can be done in the app under "My trips". Meal vouchers are issued at the airport service desk for waits over 2 hours."""

ANGRY_CUSTOMER = """Hello,

I am writing for the THIRD time about order NH-88213 and frankly I am losing my patience. I ordered a set of six ceramic bowls and a matching serving platter on the 2nd of the month. The tracking said delivered on the 9th, but what actually arrived was a box that had clearly been dropped from a great height. Four of the six bowls were broken, the platter was in three pieces, and there was ceramic dust all over the inside of the box. I took photos the same evening.

I called your phone line on the 10th and was told someone would email me within 48 hours. Nobody did. I then wrote to this address on the 13th and got an automatic reply with a ticket number and nothing else. It is now the 20th. In the meantime I had guests over for a dinner I specifically bought these for, and I had to borrow bowls from my neighbour, which was embarrassing to say the least.

I have been a customer of yours for years, I have recommended you to friends, and this is how I'm treated? I don't want a voucher, I don't want "we're sorry for the inconvenience", I want either the full set replaced and delivered properly packed, or my money back, all of it, including the shipping I paid. I also want someone to actually confirm in writing what is going to happen and when.

Please do not send me another automated reply. I have attached the photos again (the same ones as before).

Regards,
Margaret Ellison"""

CUSTOMER_SUPPORT = [
    (
        E,
        ask(
            "my internet keeps dropping every few hours since yesterday. what can i do??",
            system=ISP_SUPPORT,
        ),
    ),
    (E, ask("How do I change the wifi password on my router?", system=ISP_SUPPORT)),
    (
        E,
        ask(
            "I've been charged twice for my March bill, 49.99 each time. I want one of them back.",
            system=ISP_SUPPORT,
        ),
    ),
    (
        E,
        ask(
            "ok I restarted it and the light is still orange. now what",
            system=ISP_SUPPORT,
            history=[
                (
                    "no internet since this morning",
                    "Sorry about that! Could you first restart your router: unplug it for 30 seconds, plug it back in, and wait 2 minutes. What colour is the status light afterwards?",
                )
            ],
        ),
    ),
    (E, ask("Where is my order 48213?", system=SHOP_SUPPORT, tools=ORDER_TOOLS)),
    (E, ask("Do you ship to Norway? And how long does it take?", system=SHOP_SUPPORT)),
    (
        E,
        ask(
            "I opened the box of the duvet but didn't use it. Can I still return it?",
            system=SHOP_SUPPORT,
        ),
    ),
    (E, ask("Are you open on Sunday? I want to call about my delivery.", system=SHOP_SUPPORT)),
    (
        E,
        ask(
            "I placed an order an hour ago and put in my old address by mistake, can you change it? Order 50117.",
            system=SHOP_SUPPORT,
            tools=ORDER_TOOLS,
        ),
    ),
    (
        E,
        ask(
            "The lamp arrived with a cracked base. I want to send it back.",
            system=SHOP_SUPPORT,
            tools=ORDER_TOOLS,
            history=[
                (
                    "hi, problem with my order 49902",
                    "Hi! I'm sorry to hear that. What seems to be the problem with order 49902?",
                )
            ],
        ),
    ),
    (E, ask(ANGRY_CUSTOMER, system=SHOP_SUPPORT)),
    (E, ask("How do I activate my new debit card?", system=BANK_SUPPORT)),
    (
        E,
        ask(
            "what's the difference between your savings account and the fixed deposit thing",
            system=BANK_SUPPORT,
        ),
    ),
    (
        E,
        ask(
            "I think I lost my card at the supermarket. What do I do right now?",
            system=BANK_SUPPORT,
        ),
    ),
    (
        E,
        ask(
            "My flight SB 1432 from Lisbon to Berlin tomorrow was just cancelled. What are my options?",
            system=AIRLINE_SUPPORT,
        ),
    ),
    (
        E,
        ask(
            "ok and where do I get the meal voucher?",
            system=AIRLINE_SUPPORT,
            history=[
                (
                    "our flight is delayed 4 hours",
                    "I'm sorry about the delay. You can follow the new departure time in the app under My trips. Is there anything specific I can help with?",
                ),
                (
                    "can we get food or something",
                    "Yes, for waits over 2 hours you are entitled to a meal voucher.",
                ),
                ("nice", "Anything else I can help you with?"),
            ],
        ),
    ),
    (
        E,
        ask(
            "Your app keeps logging me out every time I switch apps. It's really annoying. iPhone 13, latest iOS."
        ),
    ),
    (
        E,
        ask(
            "I forgot my password and the reset email never arrives. I've checked spam.",
            system="You are the help assistant for the Lumo fitness app.",
        ),
    ),
    (
        E,
        ask(
            "Book a table for 4 at Osteria Nonna tomorrow at 7:30pm please", tools=RESTAURANT_TOOLS
        ),
    ),
    (
        E,
        ask(
            "Is the blender safe to keep using? It made a burning smell the last two times I used it for smoothies.",
            system="You are the support assistant for Vortex kitchen appliances.",
        ),
    ),
    (
        E,
        ask(
            "thanks, that's all!",
            system=ISP_SUPPORT,
            history=[
                (
                    "how do i see my data usage",
                    "You can see it in the Brightline app under Account > Usage, or by logging in at my.brightline.example.",
                ),
                ("found it", "Great! Anything else I can help with?"),
            ],
        ),
    ),
]


# --------------------------------------------------------------------------------------------
# Easy: rewriting and proofreading (several long inputs, some full of "analysis" words).
# --------------------------------------------------------------------------------------------

COVER_LETTER = """Dear Hiring Manager,

I am writing to apply for the position of Junior Data Analyst at Greenfield Logistics, which I seen advertised on your careers page last week. I recently graduated from the University of Leeds with a degree in Economics, where I focused on statistics and econometrics and I am very exited about the opportunity to apply my skills in a real business environment.

During my final year I completed a dissertation on the effect of fuel prices on regional delivery times, using public data from the Department for Transport. This involved cleaning a large dataset in Excel and Python, building simple regression models, and presenting my findings to my supervisor and a panel of lecturers. I also worked part-time at a local warehouse for two years, so I have a practical understanding of how goods actually moves through a supply chain, which I believe makes me a good fit for a logistics company.

I am a quick learner, I work well in teams, and I am comfortable with tools like Excel, SQL and Power BI. I am particularly interested in Greenfield because of your recent expansion into same-day delivery, and I would love to be part of a team that helps make those operations more efficient.

Thank you for considering my application. I have attached my CV and I would be happy to discuss how I could contribute to your team. I am available for an interview at any time that suits you.

Yours faithfully,
Daniel Okafor"""

STRATEGY_MEMO = """In this memo we analyse the trade-offs between the two options the steering group asked us to evaluate. First, we compare the cost of extending the current contract with the cost of a new tender, and we contrast the risks of each in detail. Second, we evaluate whether the new design of the service actually requires a new architecture or only a plan to optimise the existing one. Having analysed both, and having weighed the pros and cons in depth, our recommendation is to extend the contract for one year while we design the tender properly, because rushing it would expose us to exactly the risks the last audit flagged. We would like to explain why in more detail at the next meeting."""

LEGALESE = "Notwithstanding anything to the contrary herein, the Company shall retain Personal Data for no longer than is reasonably necessary for the fulfilment of the purposes for which such data was collected, save where a longer retention period is required or permitted by applicable law, in which case the data shall be retained for such longer period and thereafter securely erased."

REWRITING = [
    (
        E,
        ask(
            "Make this sound more professional: hey guys, meeting got moved to 3, dont be late pls"
        ),
    ),
    (E, ask("Fix the grammar: Me and him goes to the store yesterday and buyed three apple.")),
    (
        E,
        ask(
            "Turn these notes into a polite email to my landlord:\n- heater broken since tuesday\n- called twice, no answer\n- need it fixed by friday, we have a baby at home"
        ),
    ),
    (
        E,
        ask(
            "Paraphrase this: The rapid adoption of remote work has fundamentally changed how companies think about office space."
        ),
    ),
    (
        E,
        ask(
            "Make this LinkedIn post less cringe: 'Humbled and honored to announce that I have accepted a new role!!! 🚀🚀 Grind never stops. Agree?'"
        ),
    ),
    (
        E,
        ask(
            "Can you proofread my cover letter and fix any mistakes? Keep my voice.\n\n"
            + COVER_LETTER
        ),
    ),
    (E, ask("Rewrite this in plain English for customers:\n\n" + LEGALESE)),
    (E, ask("Change to passive voice: The committee approved the new budget on Monday.")),
    (
        E,
        ask(
            "Write a friendlier version of this error message: 'ERROR 4012: Invalid input. Operation aborted.'"
        ),
    ),
    (
        E,
        ask(
            "Make this product description more exciting: Stainless steel water bottle, 750 ml, keeps drinks cold for 24 hours, dishwasher safe."
        ),
    ),
    (
        E,
        ask(
            "Shorten this to fit in a tweet: We're excited to share that our community garden will open to the public this Saturday from 10am. Come along for free seedlings, a composting workshop, and lemonade made by the kids from the school next door!"
        ),
    ),
    (
        E,
        ask(
            "Please make this memo about 40% shorter without changing the recommendation:\n\n"
            + STRATEGY_MEMO
        ),
    ),
    (
        E,
        ask(
            "Rewrite like a pirate would say it: We will arrive at the harbour at noon and unload the cargo."
        ),
    ),
    (
        E,
        ask(
            "Make this gender-neutral: Each employee should submit his timesheet to his manager by Friday."
        ),
    ),
    (E, ask("Capitalize this as a title: the lord of the rings: the return of the king")),
    (
        E,
        ask(
            "Rephrase more politely: 'Why haven't you answered my email from last week?'",
            max_tokens=80,
        ),
    ),
    (
        E,
        ask(
            "Convert this paragraph to bullet points: Our new plan includes unlimited calls, 50 GB of data, free roaming in the EU, and a 12-month contract. You can cancel in the first 14 days at no cost, and there is a one-time activation fee of 10 euros."
        ),
    ),
]

# --------------------------------------------------------------------------------------------
# Translation: everyday text is easy; wordplay, verse and low-resource languages are not.
# --------------------------------------------------------------------------------------------

EMAIL_TO_TRANSLATE = """Hi Markus,

Thanks again for hosting us last week, the workshop was really productive and the team enjoyed the dinner a lot. As discussed, I'm sending you the updated timeline: we would like to have the first prototype ready by the end of March and start the field test in April with around 20 customers. Could you check with your colleagues in the warehouse whether that works for them, especially the Easter holidays?

I'll also send the signed NDA by Friday. If you need anything else from our side, just let me know.

Best regards,
Sofia"""

FAQ_TO_TRANSLATE = """Frequently asked questions

How long does delivery take?
Orders placed before 2 pm on a working day are shipped the same day. Delivery usually takes 2 to 4 working days.

Can I change or cancel my order?
You can change or cancel your order as long as it has not been shipped. Go to "My orders" and select the order you want to change.

How do I return an item?
You have 30 days to return an item. Print the return label from your account, pack the item in its original packaging if possible, and drop it off at any post office.

When will I get my refund?
We refund you within 5 working days after we receive your return. The money goes back to the payment method you used.

Do you offer gift wrapping?
Yes. You can choose gift wrapping at checkout for 3 euros per item. We will not include the price in the parcel.

How can I contact you?
You can reach our customer service by email or chat, Monday to Saturday from 9 am to 7 pm."""

SONNET_18 = """Shall I compare thee to a summer's day?
Thou art more lovely and more temperate:
Rough winds do shake the darling buds of May,
And summer's lease hath all too short a date;
Sometime too hot the eye of heaven shines,
And often is his gold complexion dimm'd;
And every fair from fair sometime declines,
By chance or nature's changing course untrimm'd;"""

TRANSLATION = [
    (E, ask("Translate to Spanish: Where is the nearest train station?")),
    (E, ask("How do you say 'thank you very much' in Japanese?")),
    (
        E,
        ask(
            "Translate into French: I'd like to book a double room for two nights, from the 14th to the 16th of May."
        ),
    ),
    (E, ask("Was heißt 'Kündigungsfrist' auf Englisch?")),
    (E, ask("Please translate this email into German, same tone:\n\n" + EMAIL_TO_TRANSLATE)),
    (E, ask("Traduce al inglés: Mañana no puedo ir a la reunión porque tengo cita con el médico.")),
    (E, ask("What does 'carpe diem' mean?")),
    (
        E,
        ask(
            "Translate our FAQ page into Portuguese (Portugal):\n\n" + FAQ_TO_TRANSLATE,
            max_tokens=2048,
        ),
    ),
    (E, ask("'Happy New Year' in 5 different languages please")),
    (
        E,
        ask(
            "Dutch -> English: De vergadering is verplaatst naar donderdag om tien uur.",
            system="You are a translation engine. Output only the translation, nothing else.",
        ),
    ),
    (E, ask("Translate to Polish: Please keep your ticket until the end of the journey.")),
    (E, ask("Translate to Italian: The package will arrive on Tuesday between 9 and 12.")),
    (
        H,
        ask(
            "Translate this into French verse, keeping the rhyme scheme (ABAB CDCD) and roughly iambic pentameter, and don't just paraphrase:\n\n"
            + SONNET_18
        ),
    ),
    (
        H,
        ask(
            "Translate into Finnish and keep the pun working: 'I used to be a banker, but I lost interest.' If the pun can't survive, write an equivalent Finnish joke and explain the wordplay."
        ),
    ),
    (
        H,
        ask(
            "Translate into Swahili for a health clinic poster: 'Wash your hands with soap for at least 20 seconds before eating and after using the toilet. Boil drinking water if you are not sure it is safe.'"
        ),
    ),
    (
        H,
        ask(
            "Translate this Japanese contract clause into precise English, and note any ambiguity a lawyer should know about: 「乙は、甲の書面による事前の承諾なく、本契約上の地位又は本契約に基づく権利義務の全部若しくは一部を第三者に譲渡し、又は担保に供してはならない。ただし、乙の子会社への譲渡についてはこの限りでない。」"
        ),
    ),
]


# --------------------------------------------------------------------------------------------
# Easy: summarising (mostly long inputs: long is not the same as hard).
# --------------------------------------------------------------------------------------------

OFFSITE_EMAIL = """Subject: Team offsite - logistics, agenda and a few requests

Hi everyone,

As promised, here are the details for our team offsite next month. Please read through to the end, there are a couple of things I need from each of you by Friday.

Dates and location
We'll be at the Hillcrest Lodge near Windermere from Wednesday the 12th to Friday the 14th. The lodge is about a 20-minute taxi ride from Windermere station. We've booked the whole east wing, so everyone gets their own room. Check-in is from 3 pm on Wednesday and check-out is at 11 am on Friday, but we can keep the meeting room until 3 pm.

Travel
The company will pay for standard-class train tickets. Please book through the travel portal as usual and use the project code OFF-2024 so finance can track it. If you'd rather drive, mileage will be reimbursed at the normal rate, but please let me know so I can reserve a parking space (the lodge only has eight). We'll share taxis from the station; I'll set up a spreadsheet so people arriving on the same train can find each other.

Agenda
Wednesday afternoon is deliberately light: arrive, settle in, and we'll do a short welcome session at 5 pm followed by dinner at 7. Thursday is the main working day. In the morning we'll review the results of the year and the customer survey; after lunch we split into three groups to work on next year's priorities (product, operations, and hiring). Thursday evening is free until dinner, and there's an optional guided walk around the lake at 4 pm if the weather is good. Friday morning we'll bring the groups' proposals together and agree on the top five priorities, and we'll finish with lunch.

Food
All meals are included. The lodge can handle vegetarian, vegan, gluten-free and most allergies, but they need to know in advance. Please fill in the dietary form (link below) even if you have no requirements, so I know you've seen it.

What I need from you by Friday
1. Your travel plan (train or car, and roughly what time you'll arrive).
2. The dietary form.
3. One slide with the thing you are proudest of from this year. Keep it to one slide, honestly, we have a lot of people.

Bring walking shoes and a rain jacket - it's the Lake District, it will rain at some point. If you have any questions or anything that would make it hard for you to attend, just message me directly.

Looking forward to it!
Priya"""

REDDIT_POST = """So this is kind of a long story but I need advice. My (29F) roommate (31F) and I have lived together for three years and it's been mostly great. About six months ago her boyfriend started staying over, first a couple of nights a week, now basically every night. He's nice enough, but he doesn't pay anything toward rent or utilities, he takes long showers in the morning when I need to get ready for work, and he uses my kitchen stuff without washing it. Our electricity bill has gone up by about a third.

I brought it up once, casually, and she got defensive and said he "doesn't really live here" because he still has his own apartment (which he apparently sublets?). Since then things have been a bit awkward. I don't want to lose the friendship and honestly I can't afford to move out right now because our lease runs until next August and rents have gone crazy.

I'm thinking of proposing that he pays a third of utilities and that we set up a bathroom schedule in the mornings. My sister says I should go straight to the landlord because our lease says guests can't stay more than 14 nights in a row. I don't want to go nuclear. Am I being unreasonable? How do I bring this up without it blowing up?"""

MEETING_NOTES = """Product sync 14/03
Attendees: Jana, Tom, Wei, Rosa, Ahmed (notes)

- Release 4.2: QA found 3 blockers, 2 fixed, the last one (export to CSV drops unicode chars) owned by Wei, ETA Thursday. Release moved from Tue to Fri 21/03.
- Tom: support tickets about the new onboarding up 40% this week, mostly people not finding the skip button. Rosa to make the button more visible, small change, can go in 4.2.
- Pricing page: marketing wants new copy live by end of month. Jana to review text by Wed. Legal has to check the refund wording first - Ahmed to send it to legal today.
- Hiring: 2 candidates for the backend role in final round next week. Wei and Tom on the panel.
- Rosa on holiday 24/03-04/04, Jana covers design questions.
- AOB: office moving to 3rd floor in May, details from facilities later.
"""

NEWS_ARTICLE = """The city council voted 7-2 on Tuesday night to approve a pilot programme that will close three blocks of Market Street to private cars on weekends from June through September. Buses, taxis, delivery vehicles before 10 am and emergency services will still be allowed through.

Supporters, including the local business association, argue that the change will bring more foot traffic to shops and restaurants. A similar pilot in the neighbouring town of Westbury last summer saw weekend sales in the affected area rise by 12% compared with the year before, according to figures from the town's chamber of commerce, though critics point out that the summer was unusually dry and warm.

Opponents, mostly residents of the side streets, worry that traffic will simply be pushed into quieter residential roads. Council member Dana Ruiz, who voted against the plan, said the council had "not done its homework" on where the displaced cars would go. The transport department has promised to install counters on four nearby streets to measure any increase.

The pilot will cost an estimated $180,000, most of which will go on signage, temporary planters and extra bike parking. The council will review the results in October and decide whether to make the closure permanent, extend it to weekdays, or drop it altogether. A public consultation will open online next month."""

EMAIL_THREAD = """From: Carla Mendes
To: Facilities
Subject: RE: RE: Broken air conditioning, 2nd floor

Any update? It's 29 degrees in here again today.

---
From: Facilities
To: Carla Mendes
Subject: RE: Broken air conditioning, 2nd floor

Hi Carla, the technician came on Monday and found that the compressor needs replacing. The part has been ordered and should arrive within 7-10 working days. In the meantime we've put two portable units in the meeting rooms. Sorry for the inconvenience.

---
From: Carla Mendes
To: Facilities
Subject: RE: Broken air conditioning, 2nd floor

Thanks. Just to add, the west side is worse than the east side, people by the windows are really struggling in the afternoon.

---
From: Facilities
To: Carla Mendes
Subject: RE: Broken air conditioning, 2nd floor

Hi Carla, thanks for letting us know, we've logged it (ticket 55120) and a technician will come on Monday.

---
From: Carla Mendes
To: Facilities
Subject: Broken air conditioning, 2nd floor

Hello, the air conditioning on the second floor has not been working since Thursday. Could someone take a look?"""

CHANGELOG = """## v3.8.0

### Added
- `Client.stream()` now accepts a `timeout=` argument; the default stays 30 s.
- New `retry_on()` helper to declare which status codes are retried.
- Support for Python 3.13.

### Changed
- `Session.close()` is now idempotent; calling it twice no longer raises.
- The default connection pool size went from 10 to 20.
- `parse_config()` emits a warning instead of failing on unknown keys.

### Fixed
- Fixed a memory leak when a streaming response was abandoned mid-way (#1841).
- `upload()` no longer sends an empty body when given a generator (#1852).
- Proxy credentials containing `@` are now URL-encoded correctly (#1860).

### Removed
- The deprecated `legacy_auth=` flag, deprecated since v3.2.
"""

REVIEWS = """★★★★★ "Comfortable from day one, I walk 10 km a day in them." - Lena
★★☆☆☆ "Nice looking but the sole started peeling after 2 months." - Marco
★★★★☆ "Run half a size small. Otherwise great, very light." - Joe
★☆☆☆☆ "Sole came off after 6 weeks, customer service didn't reply." - Aisha
★★★★★ "Best trainers I've owned, great for wide feet." - Sam
★★★☆☆ "Comfortable but not waterproof at all, despite what the ad says." - Petra
★★★★☆ "Good value, sizing a bit small." - Tom"""

SUMMARISATION = [
    (
        E,
        ask(
            "Can you summarise this email for me? What do I actually need to do and by when?\n\n"
            + OFFSITE_EMAIL
        ),
    ),
    (E, ask("tl;dr please\n\n" + REDDIT_POST)),
    (
        E,
        ask(
            "Turn these meeting notes into a list of action items with owners and dates:\n\n"
            + MEETING_NOTES
        ),
    ),
    (E, ask("Summarise this article in 3 bullet points:\n\n" + NEWS_ARTICLE)),
    (E, ask("What's the current status of this issue? One or two sentences.\n\n" + EMAIL_THREAD)),
    (
        E,
        ask(
            "Summarise what changed in this release for our internal newsletter, non-technical readers:\n\n"
            + CHANGELOG
        ),
    ),
    (
        E,
        ask(
            "Summarise these product reviews: what do people like and what do they complain about?\n\n"
            + REVIEWS
        ),
    ),
    (
        E,
        ask(
            "Summarise in one sentence: Photosynthesis is the process by which green plants and some other organisms use sunlight to synthesise foods from carbon dioxide and water. It generally involves the green pigment chlorophyll and generates oxygen as a by-product."
        ),
    ),
    (E, ask("Give me a 2-sentence summary of the plot of Romeo and Juliet.")),
    (
        E,
        ask(
            "Summarise this for a busy executive, 50 words max:\n\n" + STRATEGY_MEMO, max_tokens=120
        ),
    ),
    (
        E,
        ask(
            "Write a short summary of this cover letter for the recruiter's notes (who, what role, key strengths):\n\n"
            + COVER_LETTER
        ),
    ),
    (
        E,
        ask(
            "Summarise the main points of this thread for my manager:\n\n" + EMAIL_THREAD,
            system="You are an assistant that writes concise workplace summaries.",
        ),
    ),
    (
        E,
        ask(
            "Can you give me the key facts from this article as a short list (what, where, when, cost)?\n\n"
            + NEWS_ARTICLE,
            max_tokens=4096,
        ),
    ),
]


# --------------------------------------------------------------------------------------------
# Easy: simple code questions (code blocks and code words do not make a request hard).
# --------------------------------------------------------------------------------------------

EXPRESS_SERVER = """```js
const express = require('express');
const helmet = require('helmet');
const morgan = require('morgan');
const cors = require('cors');
const { Pool } = require('pg');

const app = express();
const pool = new Pool({
  host: process.env.DB_HOST || 'localhost',
  port: 5432,
  user: 'shop',
  password: process.env.DB_PASSWORD,
  database: 'shop',
  max: 10,
});

app.use(helmet());
app.use(cors({ origin: ['https://shop.example.com'] }));
app.use(express.json({ limit: '1mb' }));
app.use(morgan('combined'));

app.get('/health', (req, res) => {
  res.json({ status: 'ok' });
});

app.get('/products', async (req, res, next) => {
  try {
    const { rows } = await pool.query('SELECT id, name, price FROM products ORDER BY name');
    res.json(rows);
  } catch (err) {
    next(err);
  }
});

app.get('/products/:id', async (req, res, next) => {
  try {
    const { rows } = await pool.query('SELECT * FROM products WHERE id = $1', [req.params.id]);
    if (rows.length === 0) return res.status(404).json({ error: 'not found' });
    res.json(rows[0]);
  } catch (err) {
    next(err);
  }
});

app.post('/orders', async (req, res, next) => {
  try {
    const { productId, quantity } = req.body;
    const { rows } = await pool.query(
      'INSERT INTO orders (product_id, quantity) VALUES ($1, $2) RETURNING id',
      [productId, quantity],
    );
    res.status(201).json({ id: rows[0].id });
  } catch (err) {
    next(err);
  }
});

app.use((err, req, res, next) => {
  console.error(err);
  res.status(500).json({ error: 'internal error' });
});

const PORT = process.env.PORT || 8081;
app.listen(PORT, () => {
  console.log(`shop api listening on ${PORT}`);
});
```"""

INVENTORY_PY = """```python
import csv
from datetime import date


def load_items(path):
    items = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            items.append(
                {"sku": row["sku"], "name": row["name"], "qty": int(row["qty"]), "expires": date.fromisoformat(row["expires"])}
            )
    return items


def low_stock(items, limit=5):
    return [i for i in items if i["qty"] < limit]


def expired(items, today=None):
    today = today or date.today()
    return [i for i in items if i["expires"] < today]


def report(items):
    lines = []
    for i in low_stock(items):
        lines.append(f"LOW {i['sku']} {i['name']} ({i['qty']} left)")
    for i in expired(items):
        lines.append(f"EXPIRED {i['sku']} {i['name']} ({i['expires']})")
    return "\\n".join(lines)
```"""

SIMPLE_CODE = [
    (E, ask("How do I reverse a list in Python?")),
    (E, ask("What's the difference between == and === in JavaScript?")),
    (E, ask("Write a Python function that checks if a number is even.")),
    (E, ask("how do i center a div horizontally and vertically")),
    (E, ask("git: how do I undo my last commit but keep the changes?")),
    (E, ask("What does this print?\n```python\nprint([x * 2 for x in range(5)])\n```")),
    (
        E,
        ask(
            "Write a SQL query that returns all users older than 30 from a table called users (columns: id, name, age)."
        ),
    ),
    (E, ask("How do I read a CSV file with pandas and show the first 5 rows?")),
    (
        E,
        ask(
            "Why doesn't this work?\n```python\nprint 'hello world'\n```\nI get SyntaxError: Missing parentheses"
        ),
    ),
    (
        E,
        ask(
            "I keep getting IndentationError: expected an indented block\n```python\ndef greet(name):\nprint('Hello ' + name)\n```"
        ),
    ),
    (
        E,
        ask(
            'Convert this JSON to YAML:\n{"name": "api", "replicas": 3, "ports": [80, 443], "env": {"DEBUG": false}}'
        ),
    ),
    (E, ask("bash one-liner to count the lines in all .py files in a folder, recursively?")),
    (E, ask("What is a REST API? Short answer please.")),
    (E, ask("Give me a simple regex for an email address, doesn't need to be perfect.")),
    (E, ask("Add type hints to this:\n```python\ndef add(a, b):\n    return a + b\n```")),
    (E, ask("What's the time complexity of binary search?")),
    (
        E,
        ask(
            "Which port does this server listen on, and which database does it connect to?\n\n"
            + EXPRESS_SERVER
        ),
    ),
    (
        E,
        ask(
            "Add docstrings to every function in this file. Don't change the code.\n\n"
            + INVENTORY_PY,
            max_tokens=1500,
        ),
    ),
    (
        E,
        ask(
            "What does this JavaScript do?\n```js\nconst total = cart.reduce((sum, item) => sum + item.price * item.qty, 0);\n```"
        ),
    ),
    (E, ask("How do I make a Python virtual environment on Windows?")),
    (
        E,
        ask(
            "What's the difference between a list and a tuple in Python?",
            system="You are a patient programming tutor for beginners.",
        ),
    ),
    (
        E,
        ask(
            "Rename the variables in this to something readable:\n```python\ndef f(l):\n    s = 0\n    for x in l:\n        s += x\n    return s / len(l)\n```"
        ),
    ),
]

# --------------------------------------------------------------------------------------------
# Easy: arithmetic and textbook maths (maths words, small numbers, one step).
# --------------------------------------------------------------------------------------------

SIMPLE_MATH = [
    (E, ask("What is 15% of 80?")),
    (E, ask("Convert 5 miles to kilometers")),
    (
        E,
        ask(
            "If I buy 3 notebooks at $2.50 each and a pen for $1.20, how much do I spend in total?"
        ),
    ),
    (E, ask("what's 144/12")),
    (E, ask("What is the derivative of x^2?")),
    (E, ask("Solve for x: 2x + 3 = 11")),
    (E, ask("What's the probability of getting heads twice in a row with a fair coin?")),
    (E, ask("Round 3.14159 to two decimal places.")),
    (E, ask("How many minutes are there in 3.5 hours?")),
    (E, ask("What is the area of a circle with a radius of 4 cm?")),
    (E, ask("What does the Pythagorean theorem say? Give an example.")),
    (E, ask("Dinner was $84 for 4 people and we want to tip 15%. How much does each person pay?")),
    (E, ask("What's the average of 4, 8, 15, 16, 23 and 42?")),
    (E, ask("Convert 72°F to Celsius")),
    (E, ask("What is a matrix in maths, in simple terms?")),
    (E, ask("Prove that the sum of two even numbers is always even.")),
    (E, ask("Is 97 a prime number?")),
    (E, ask("My kid's homework: what is 3/4 + 1/8? Please explain it simply so I can help her.")),
]


# --------------------------------------------------------------------------------------------
# Easy: extraction and simple tool calls (structured output and tools on easy work).
# --------------------------------------------------------------------------------------------

SIGNATURE = """Best,
Dr. Helena Vogt
Head of Procurement | Albrecht Medical GmbH
Tel: +49 89 2180 4471 | Mobile: +49 171 555 0192
helena.vogt@albrecht-medical.example
Leopoldstr. 112, 80802 München"""

INVOICE = """INVOICE

Invoice number: INV-2024-00871
Invoice date: 05/11/2024
Due date: 05/12/2024
Customer number: C-10442

From:
Blue Harbor Printing Ltd.
Unit 4, Dockside Business Park
Bristol BS1 6XN, United Kingdom
VAT reg. no. GB 284 1177 30

Bill to:
Marlow & Finch Architects
17 Queen Square
Bath BA1 2HN, United Kingdom
Attn: Accounts Payable

Description                                   Qty     Unit price     Amount
A1 presentation boards, matt laminated         12      £18.50         £222.00
A3 brochures, 24 pages, 170gsm silk            250     £3.20          £800.00
Business cards, 400gsm, double-sided           2000    £0.045         £90.00
Design adjustments (hourly)                    3       £45.00         £135.00
Courier delivery, same day                     1       £25.00         £25.00

Subtotal                                                              £1,272.00
VAT 20%                                                               £254.40
Total due                                                             £1,526.40

Payment terms: 30 days net. Please quote the invoice number as payment reference.
Bank: Westshore Bank plc, Sort code 40-22-17, Account no. 71839204
IBAN GB29 WSBK 4022 1771 8392 04, BIC WSBKGB2L

Thank you for your business! Questions about this invoice: accounts@blueharbor.example or 0117 496 0831."""

RECIPE = """Easy banana bread: Mash 3 ripe bananas in a bowl. Stir in 75 g melted butter, then 150 g sugar, 1 beaten egg and 1 tsp vanilla. Sprinkle 1 tsp baking soda and a pinch of salt over the mixture and mix. Add 190 g plain flour and stir until just combined. Pour into a buttered loaf tin and bake at 175°C for 55-60 minutes."""

NEWS_SNIPPET = "Siemens and the city of Hamburg signed an agreement on Monday to build a hydrogen refuelling station near the port, Mayor Peter Tschentscher announced. The station, which will supply buses operated by Hochbahn, is expected to open in 2026."

EXTRACTION = [
    (
        E,
        ask(
            "Extract the name, job title, company, email and phone numbers from this signature:\n\n"
            + SIGNATURE,
            response_format=JSON_OBJECT,
        ),
    ),
    (
        E,
        ask(
            "Extract the invoice fields.\n\n" + INVOICE,
            response_format=json_schema(
                "invoice",
                {
                    "invoice_number": STR,
                    "invoice_date": STR,
                    "due_date": STR,
                    "supplier": STR,
                    "customer": STR,
                    "total": STR,
                    "iban": STR,
                },
            ),
        ),
    ),
    (
        E,
        ask(
            "List the ingredients with quantities as JSON.\n\n" + RECIPE,
            response_format=JSON_OBJECT,
        ),
    ),
    (
        E,
        ask(
            "Extract people, organisations and places.\n\n" + NEWS_SNIPPET,
            response_format=json_schema(
                "entities", {"people": STR_LIST, "organisations": STR_LIST, "places": STR_LIST}
            ),
        ),
    ),
    (
        E,
        ask(
            "Which language is this? 'Ik heb geen idee waar mijn sleutels zijn.'",
            response_format=json_schema("language", {"language": STR, "iso_code": STR}),
        ),
    ),
    (E, ask("Give me 5 random first names as a JSON list.", response_format=JSON_OBJECT)),
    (
        E,
        ask(
            "What's the weather going to be like in Paris tomorrow?",
            tools=WEATHER_TOOL,
            system="Today is 2024-06-11.",
        ),
    ),
    (E, ask("email bob@example.com that I'll be 10 minutes late to standup", tools=EMAIL_TOOL)),
    (
        E,
        ask(
            "Put a meeting with priya@example.com in my calendar on Friday 10:00-10:30, title 'Budget check-in'.",
            tools=CALENDAR_TOOLS,
            system="Today is Monday 2024-06-10. The user's timezone is Europe/Berlin.",
        ),
    ),
    (E, ask("how much is 250 dollars in euros right now", tools=CURRENCY_TOOL)),
    (
        E,
        ask(
            "Pull out the action items from these notes as a list of {owner, task, due}.\n\n"
            + MEETING_NOTES,
            response_format=JSON_OBJECT,
        ),
    ),
    (
        E,
        ask(
            "Convert this date to ISO 8601: 'Tuesday, 3rd of September 2024, quarter past four in the afternoon'",
            response_format=json_schema("date", {"iso": STR}),
        ),
    ),
    (
        E,
        ask(
            "Get the order number and the customer's name from this message: 'Hi, it's Tom Becker here, my order NH-77120 hasn't arrived yet.'",
            response_format=json_schema("ticket", {"order_number": STR, "customer_name": STR}),
        ),
    ),
    (
        E,
        ask(
            "How many orders did we get yesterday?",
            tools=SQL_TOOLS,
            system="You are a data assistant. The warehouse has a table orders(id, created_at, amount, customer_id). Today is 2024-06-12.",
        ),
    ),
]

CLASSIFICATION = [
    (
        E,
        ask(
            "Is this review positive or negative? 'The food was cold and the waiter ignored us for 20 minutes.'"
        ),
    ),
    (
        E,
        ask(
            "Which team should handle this ticket: billing, technical or sales? 'I can't log in since the update yesterday.'",
            response_format=json_schema(
                "routing", {"team": {"type": "string", "enum": ["billing", "technical", "sales"]}}
            ),
        ),
    ),
    (
        E,
        ask(
            "Is this spam? 'Congratulations!! You have been selected to receive a $1000 gift card. Click here to claim within 24 hours.'"
        ),
    ),
    (
        E,
        ask(
            "Put these expenses in categories: Uber $23, Netflix $15.99, Whole Foods $87.40, Shell $45, Spotify $10.99"
        ),
    ),
    (E, ask("What's the tone of this message: 'Per my last email, the report was due yesterday.'")),
    (E, ask("Which of these is a mammal: shark, dolphin, trout, octopus?")),
    (
        E,
        ask(
            "Classify each review as positive, negative or mixed.\n\n" + REVIEWS,
            response_format=JSON_OBJECT,
        ),
    ),
    (E, ask("Is this sentence formal or informal? 'Gonna grab some food, brb.'", max_tokens=20)),
]

CREATIVE = [
    (E, ask("Write a haiku about autumn rain.")),
    (
        E,
        ask(
            "Write a short poem for my grandma's 80th birthday. She loves her garden, especially her roses."
        ),
    ),
    (E, ask("Give me 10 name ideas for a cozy coffee shop that also sells books.")),
    (E, ask("Write a two-sentence horror story.")),
    (E, ask("Write a limerick about a cat who loves lasagna.")),
    (E, ask("Tagline for an eco-friendly bamboo toothbrush, a few options please")),
    (
        E,
        ask(
            "Write a bedtime story (about 300 words) about a little dragon who is afraid of the dark.",
            max_tokens=600,
        ),
    ),
    (E, ask("Brainstorm 5 blog post ideas about composting at home.")),
    (
        E,
        ask(
            "Write an out-of-office reply: I'm on holiday from Dec 20 to Jan 3, urgent things go to maria@company.example."
        ),
    ),
    (
        E,
        ask(
            "Write a toast for my best friend's wedding. Funny but heartfelt, about a minute long. We met at university when we got lost on the way to the same exam.",
            max_tokens=4096,
        ),
    ),
    (E, ask("Write a short Instagram caption for a photo of my dog at the beach")),
]


# --------------------------------------------------------------------------------------------
# Hard: multi-step maths (several are short; few use the words the classifier looks for).
# --------------------------------------------------------------------------------------------

MATH_MULTISTEP = [
    (
        H,
        ask(
            "A tank is filled by pipe A in 6 hours and by pipe B in 4 hours, and pipe C empties it in 8 hours. All three are opened together on an empty tank, but C is closed after 2 hours. How long does it take in total to fill the tank?"
        ),
    ),
    (
        H,
        ask(
            "How many positive integers less than 1000 are divisible by neither 7 nor 11 and have an even digit sum?"
        ),
    ),
    (
        H,
        ask(
            "How many ordered pairs of integers (a, b) with 1 ≤ a, b ≤ 100 are there such that a² + b² is divisible by 5?"
        ),
    ),
    (
        H,
        ask(
            "A bag has 5 red and 7 blue balls. You draw 4 balls without replacement. Given that the first ball drawn is blue, what is the probability that at least 2 of the 4 are red?"
        ),
    ),
    (H, ask("Evaluate ∫₀^∞ x³/(eˣ − 1) dx and show every step.")),
    (H, ask("What is the remainder when 3^2024 is divided by 100?")),
    (H, ask("What's the expected number of rolls of a fair die until you get two sixes in a row?")),
    (
        H,
        ask(
            "I take a $350,000 mortgage at 6.25% APR over 30 years, monthly payments. After exactly 7 years I pay an extra $20,000 lump sum and keep paying the same monthly amount. When is the loan paid off, and how much interest do I save compared to not making the lump sum?"
        ),
    ),
    (
        H,
        ask(
            "In how many ways can 8 people sit around a round table if two particular people refuse to sit next to each other?"
        ),
    ),
    (
        H,
        ask(
            "Find the eigenvalues and eigenvectors of the matrix [[2, 1, 0], [1, 2, 1], [0, 1, 2]] and write it as PDP⁻¹."
        ),
    ),
    (
        H,
        ask(
            "A disease has a prevalence of 0.5%. A test has 99% sensitivity and 95% specificity. Someone tests positive twice on two independent tests. What's the probability they actually have the disease?"
        ),
    ),
    (H, ask("How many trailing zeros does 125! have when written in base 12?")),
    (H, ask("What is the sum of all three-digit numbers whose digits are all odd?")),
    (
        H,
        ask(
            "Two trains leave stations 300 km apart at 9:00, heading toward each other at 80 km/h and 120 km/h. The faster one stops for 15 minutes at a station 100 km from its start. At what time and where do they meet?"
        ),
    ),
    (
        H,
        ask(
            "ok but where exactly did I go wrong? I still think 1/3 is right",
            history=[
                (
                    "A family has two children. At least one is a boy born on a Tuesday. What is the probability both are boys?",
                    "Let's count carefully. Each child has 14 equally likely (sex, weekday) combinations, so there are 196 equally likely pairs. Pairs with at least one Tuesday boy: 14 + 14 - 1 = 27. Of these, pairs where both are boys and at least one is a Tuesday boy: 7 + 7 - 1 = 13. So the probability is 13/27.",
                ),
                (
                    "that can't be right, the day of the week has nothing to do with it. it's 1/3",
                    "It is surprising, but the extra detail does change the answer, because it changes which families count as matching the condition.",
                ),
            ],
        ),
    ),
    (
        H,
        ask(
            "Let a, b, c be positive reals with a + b + c = 3. Find the minimum of a²/(b + c) + b²/(c + a) + c²/(a + b) and show when it's attained."
        ),
    ),
    (
        H,
        ask(
            "Solve the recurrence T(n) = 2T(n/2) + n log n exactly for n a power of 2 with T(1) = 1, not just the big-O."
        ),
    ),
    (
        H,
        ask(
            "A 5 m ladder leans against a frictionless wall on a frictionless floor and starts sliding. At what height on the wall does the top of the ladder lose contact with the wall, if it started at 4 m?"
        ),
    ),
    (
        H,
        ask(
            "We have 3 servers each with 99.5% monthly uptime, failures independent. The service needs at least 2 of 3 up. Then we add a load balancer with 99.9% uptime in series. What's the expected downtime in minutes per 30-day month, and which single upgrade helps most?"
        ),
    ),
]

# --------------------------------------------------------------------------------------------
# Hard: proofs.
# --------------------------------------------------------------------------------------------

PROOF = [
    (H, ask("Is 2^61 - 1 prime? Prove it.")),
    (H, ask("Prove that there are infinitely many primes of the form 4k + 3.")),
    (H, ask("Prove that √2 + √3 is irrational.")),
    (H, ask("Show that every tournament has a Hamiltonian path.")),
    (
        H,
        ask(
            "Prove that for every n ≥ 1, the sum of 1/k² for k = 1..n is less than 2, without using the value π²/6."
        ),
    ),
    (
        H,
        ask(
            "Let G be a group of order pq, where p < q are primes and p does not divide q - 1. Prove that G is cyclic."
        ),
    ),
    (
        H,
        ask(
            "Prove that a simple graph on n vertices with more than n²/4 edges contains a triangle."
        ),
    ),
    (
        H,
        ask(
            "Prove or disprove: if f: ℝ → ℝ is continuous and f(f(x)) = x for all x, then f has a fixed point."
        ),
    ),
    (H, ask("Show that the language {aⁿbⁿcⁿ : n ≥ 0} is not context-free.")),
    (
        H,
        ask(
            "Prove that Dijkstra's algorithm returns correct shortest-path distances when all edge weights are non-negative, and show exactly which step of the proof fails with a negative edge."
        ),
    ),
    (H, ask("Show that for every integer n, n⁵ − n is divisible by 30.")),
    (
        H,
        ask(
            "Prove that every continuous function on [0,1] is uniformly continuous. Don't just cite Heine-Cantor; give the argument."
        ),
    ),
    (
        H,
        ask(
            "Is the following argument valid? 'Every finite integral domain is a field because multiplication by a nonzero a is injective.' Fill in the missing details or point out the gap."
        ),
    ),
    (
        H,
        ask(
            "Prove that in any sequence of n² + 1 distinct real numbers there is a monotone subsequence of length n + 1."
        ),
    ),
]


# --------------------------------------------------------------------------------------------
# Hard: debugging non-trivial code.
# --------------------------------------------------------------------------------------------

ASYNC_CACHE = """```python
import asyncio
import time

class TTLCache:
    def __init__(self, ttl):
        self.ttl = ttl
        self._data = {}

    async def get_or_load(self, key, loader):
        entry = self._data.get(key)
        if entry and entry[1] > time.monotonic():
            return entry[0]
        value = await loader(key)
        self._data[key] = (value, time.monotonic() + self.ttl)
        return value

cache = TTLCache(ttl=60)

async def fetch_user(user_id):
    # calls the user service, ~200 ms
    ...

async def handler(request):
    user = await cache.get_or_load(request.user_id, fetch_user)
    return render(user)
```"""

GO_WORKERS = """```go
func processAll(ctx context.Context, jobs []Job) ([]Result, error) {
	results := make(chan Result)
	errs := make(chan error)
	var wg sync.WaitGroup

	for _, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := process(ctx, j)
			if err != nil {
				errs <- err
				return
			}
			results <- r
		}()
	}

	wg.Wait()
	close(results)

	var out []Result
	for {
		select {
		case r, ok := <-results:
			if !ok {
				return out, nil
			}
			out = append(out, r)
		case err := <-errs:
			return nil, err
		}
	}
}
```"""

C_STRINGS = """```c
#define NAME_LEN 16

struct user {
    char name[NAME_LEN];
    int id;
};

void set_name(struct user *u, const char *src) {
    strncpy(u->name, src, NAME_LEN);
}

void print_users(struct user *users, int n) {
    for (int i = 0; i <= n; i++) {
        printf("%d %s\\n", users[i].id, users[i].name);
    }
}
```"""

SQL_REVENUE = """```sql
SELECT c.region,
       SUM(o.amount)        AS revenue,
       COUNT(t.id)          AS support_tickets
FROM customers c
JOIN orders o          ON o.customer_id = c.id
LEFT JOIN tickets t    ON t.customer_id = c.id
WHERE o.created_at >= '2024-01-01'
GROUP BY c.region;
```"""

TRAINING_LOOP = """```python
model = Transformer(vocab=32000, d_model=1024, layers=24).cuda().half()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, eps=1e-8)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-4, total_steps=100_000)

for step, (x, y) in enumerate(loader):
    logits = model(x.cuda())
    probs = torch.softmax(logits.float(), dim=-1)
    loss = -(torch.log(probs).gather(-1, y.cuda().unsqueeze(-1))).mean()
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
```"""

K8S_LOGS = """$ kubectl get pods -n payments
NAME                           READY   STATUS             RESTARTS      AGE
payments-api-7d9c8b6f4-2kx8q   0/1     CrashLoopBackOff   7 (2m ago)    19m
payments-api-7d9c8b6f4-9wq2z   0/1     CrashLoopBackOff   7 (3m ago)    19m

$ kubectl describe pod payments-api-7d9c8b6f4-2kx8q -n payments
...
    Liveness:   http-get http://:8080/healthz delay=5s timeout=1s period=5s #success=1 #failure=3
    Readiness:  http-get http://:8080/ready delay=5s timeout=1s period=5s #success=1 #failure=3
    Limits:
      memory:  256Mi
    Requests:
      memory:  256Mi
    Environment:
      JAVA_TOOL_OPTIONS:  -Xms256m -Xmx512m
      SERVER_PORT:        8081
    Last State:     Terminated
      Reason:       OOMKilled
      Exit Code:    137
Events:
  Warning  Unhealthy  3m (x21 over 18m)  kubelet  Liveness probe failed: Get "http://10.4.2.17:8080/healthz": dial tcp 10.4.2.17:8080: connect: connection refused
  Normal   Killing    3m (x7 over 18m)   kubelet  Container payments-api failed liveness probe, will be restarted

$ kubectl logs payments-api-7d9c8b6f4-2kx8q -n payments --previous | tail -5
2024-06-11 09:14:02 INFO  Flyway: migrating schema to version 42
2024-06-11 09:14:09 INFO  Started PaymentsApplication in 11.8 seconds
2024-06-11 09:14:09 INFO  Tomcat started on port(s): 8081 (http)
2024-06-11 09:14:31 INFO  Warming up FX rates cache (1.2M entries)"""

BISECT = """```python
def first_at_least(xs, target):
    \"\"\"Index of the first element >= target in sorted xs, or len(xs).\"\"\"
    lo, hi = 0, len(xs) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if xs[mid] < target:
            lo = mid
        else:
            hi = mid - 1
    return lo
```"""

PIPELINE = """```python
def read_events(path):
    with open(path) as f:
        for line in f:
            yield json.loads(line)

def valid(events):
    return (e for e in events if e.get("user_id") and e.get("ts"))

def run(path):
    events = valid(read_events(path))
    n = sum(1 for _ in events)
    users = {e["user_id"] for e in events}
    by_hour = Counter(e["ts"][:13] for e in events)
    print(f"{n} events, {len(users)} users, busiest hour {by_hour.most_common(1)}")
```"""

JAVA_DEADLOCK = """"main-pool-3" #41 prio=5 os_prio=0 tid=0x00007f3c8c0d1000 nid=0x2b1f waiting for monitor entry
   java.lang.Thread.State: BLOCKED (on object monitor)
	at com.acme.ledger.Account.credit(Account.java:58)
	- waiting to lock <0x000000076b3a0e58> (a com.acme.ledger.Account)
	at com.acme.ledger.Account.transferTo(Account.java:41)
	- locked <0x000000076b3a0f10> (a com.acme.ledger.Account)
	at com.acme.ledger.TransferService.lambda$submit$0(TransferService.java:27)

"main-pool-7" #45 prio=5 os_prio=0 tid=0x00007f3c8c0e3800 nid=0x2b23 waiting for monitor entry
   java.lang.Thread.State: BLOCKED (on object monitor)
	at com.acme.ledger.Account.credit(Account.java:58)
	- waiting to lock <0x000000076b3a0f10> (a com.acme.ledger.Account)
	at com.acme.ledger.Account.transferTo(Account.java:41)
	- locked <0x000000076b3a0e58> (a com.acme.ledger.Account)
	at com.acme.ledger.TransferService.lambda$submit$0(TransferService.java:27)

```java
public synchronized void transferTo(Account other, long cents) {
    if (balance < cents) throw new InsufficientFunds();
    balance -= cents;
    other.credit(cents);
}

public synchronized void credit(long cents) {
    balance += cents;
}
```"""

CODE_DEBUGGING = [
    (
        H,
        ask(
            "Under load our user service gets hammered way more than I'd expect from a 60s cache, and sometimes users see each other's stale data after an update. What's wrong with this and how would you fix it properly?\n\n"
            + ASYNC_CACHE
        ),
    ),
    (
        H,
        ask(
            "This sometimes hangs forever and sometimes returns wrong results. Go 1.21. Why, and what's the idiomatic fix?\n\n"
            + GO_WORKERS
        ),
    ),
    (
        H,
        ask(
            "Random garbage gets printed after some names and occasionally it segfaults. Find all the bugs.\n\n"
            + C_STRINGS
        ),
    ),
    (
        H,
        ask(
            "The revenue numbers from this query are way higher than what finance reports, but only for some regions. Why?\n\n"
            + SQL_REVENUE
        ),
    ),
    (
        H,
        ask(
            "Loss goes to NaN after ~3k steps, every time. Before that it looks fine. What's causing it? List everything suspicious.\n\n"
            + TRAINING_LOOP
        ),
    ),
    (
        H,
        ask(
            "Our payments pods are in CrashLoopBackOff after yesterday's deploy. What's going on? There might be more than one problem.\n\n"
            + K8S_LOGS
        ),
    ),
    (
        H,
        ask(
            "This hangs on some inputs and returns wrong answers on others. Fix it and give me the inputs that break the current version.\n\n"
            + BISECT
        ),
    ),
    (
        H,
        ask(
            "The report always says 0 users and an empty busiest hour, but n is right. Why? And how would you restructure this so it reads the file only once?\n\n"
            + PIPELINE
        ),
    ),
    (
        H,
        ask(
            "Production froze, here's the thread dump and the code. Explain the deadlock and give a fix that doesn't serialize all transfers through one global lock.\n\n"
            + JAVA_DEADLOCK
        ),
    ),
    (
        H,
        ask(
            "I get `error[E0502]: cannot borrow `self.items` as mutable because it is also borrowed as immutable` here and I don't understand why, the borrow should be over:\n```rust\nimpl Inventory {\n    fn restock_low(&mut self) {\n        for item in self.items.iter().filter(|i| i.qty < self.min_qty) {\n            self.items.push(Item { name: item.name.clone(), qty: self.batch });\n        }\n    }\n}\n```\nWhat's the right way to write this?"
        ),
    ),
    (
        H,
        ask(
            "still flaky. now about 1 in 50 runs fails with the same assertion. what else could it be?",
            history=[
                (
                    "My pytest suite passes locally but fails ~1 in 10 on CI with `assert response.json()['count'] == 3`, got 2. The test creates 3 rows via the API and then calls GET /items. We use FastAPI + async SQLAlchemy + Postgres, tests run with pytest-xdist -n 4.",
                    "A few likely causes: (1) tests sharing the same database and running in parallel under xdist, so another test deletes or adds rows; (2) the POSTs not being committed before the GET because the session is committed in a background task; (3) read replicas. Start by giving each xdist worker its own schema.",
                ),
                (
                    "ok I gave each worker its own database. went from 1 in 10 to much better",
                    "Good, that was the main interference. If anything remains, look at the commit timing next.",
                ),
            ],
        ),
    ),
    (
        H,
        ask(
            "My React component shows the old search results for a split second and sometimes the results for the previous query overwrite the newer ones when I type fast. Why, and how do I fix it without a library?\n```jsx\nfunction Search() {\n  const [q, setQ] = useState('');\n  const [results, setResults] = useState([]);\n  useEffect(() => {\n    fetch(`/api/search?q=${q}`).then(r => r.json()).then(setResults);\n  }, [q]);\n  return <><input value={q} onChange={e => setQ(e.target.value)} /><List items={results} /></>;\n}\n```"
        ),
    ),
    (
        H,
        ask(
            "Our invoice totals are sometimes off by one cent compared to the sum of the lines shown on the PDF. We compute line = round(qty * unit_price * (1 + vat), 2) with floats and total = round(sum(qty * unit_price) * (1 + vat), 2). How should this be done correctly, and which rounding rule do tax authorities in the EU usually expect?"
        ),
    ),
    (
        H,
        ask(
            "After upgrading to Python 3.12 our service that uses `multiprocessing.Pool` with a module-level `requests.Session` and `fork` started hanging on macOS but not Linux, and on Linux we occasionally see SSL errors in children. Explain what's happening in both cases and what to change."
        ),
    ),
]


# --------------------------------------------------------------------------------------------
# Hard: writing non-trivial code.
# --------------------------------------------------------------------------------------------

CODE_NONTRIVIAL = [
    (
        H,
        ask(
            "Implement an LRU cache in Python with O(1) get/put, a per-key TTL, and thread safety. Include pytest tests for eviction order and expiry that don't rely on sleep().",
            max_tokens=3000,
        ),
    ),
    (
        H,
        ask(
            "Write a lock-free single-producer single-consumer ring buffer in C++17 with std::atomic. Justify every memory_order you use, and explain why it would be wrong with relaxed everywhere."
        ),
    ),
    (
        H,
        ask(
            "Write a parser in TypeScript for arithmetic expressions: + - * / ^, parentheses, unary minus, ^ right-associative and binding tighter than unary minus (so -2^2 = -4). Good error messages with the column of the error."
        ),
    ),
    (
        H,
        ask(
            "Given n weighted intervals [start, end), choose a set of non-overlapping intervals with maximum total weight and return the chosen intervals, not just the weight. O(n log n). Python."
        ),
    ),
    (
        H,
        ask(
            "Write a SQL query (Postgres) that returns, for each customer, the length of their longest streak of consecutive calendar months with at least one order. Table orders(customer_id, created_at)."
        ),
    ),
    (
        H,
        ask(
            'Convert this recursive function to an iterative one with an explicit stack so it doesn\'t hit the recursion limit on deep trees, keeping the exact same output order:\n```python\ndef render(node, depth=0):\n    out = ["  " * depth + "<" + node.tag + ">"]\n    for child in node.children:\n        out.extend(render(child, depth + 1))\n    out.append("  " * depth + "</" + node.tag + ">")\n    return out\n```'
        ),
    ),
    (
        H,
        ask(
            "Implement A* on a hex grid using axial coordinates, with impassable cells and per-cell terrain costs between 1 and 5. Make sure the heuristic is admissible and explain why."
        ),
    ),
    (
        H,
        ask(
            "Write a Python decorator `retry` that works on both sync and async functions, does exponential backoff with full jitter, has a max total time budget, only retries on given exception types, and preserves the function's signature for type checkers (ParamSpec). mypy --strict must pass."
        ),
    ),
    (
        H,
        ask(
            "Implement Aho-Corasick in Rust: build from a list of patterns and return all (start, pattern_index) matches in a text, including overlapping ones. No external crates."
        ),
    ),
    (
        H,
        ask(
            "Write a CUDA kernel for C = A·B with shared-memory tiling (32x32 tiles) that handles matrix sizes that aren't multiples of 32, and explain how you avoid bank conflicts."
        ),
    ),
    (
        H,
        ask(
            "Write a Redis Lua script implementing a sliding-window rate limiter (100 requests per rolling 60 s per API key) that is atomic and doesn't grow memory unboundedly, plus the Python code that calls it."
        ),
    ),
    (
        H,
        ask(
            "Implement a persistent (immutable) vector in Python with O(log n) append, get and set, using a 32-way trie like Clojure's. Include structural sharing and a tail optimisation.",
            max_tokens=4096,
        ),
    ),
    (
        H,
        ask(
            "Write a function that takes a cron expression (5 fields, with ranges, steps, lists and names like MON or JAN) and a timezone-aware datetime, and returns the next fire time. It must handle DST transitions correctly. Python, no croniter."
        ),
    ),
    (
        H,
        ask(
            "Inspect the repo, find why `make test` fails on the `test_export_roundtrip` test, fix the bug in the source (not the test), and run the tests again to confirm.",
            tools=SHELL_TOOLS,
            system="You are a coding agent working in a Python repository. Use the tools; keep changes minimal.",
        ),
    ),
]

# --------------------------------------------------------------------------------------------
# Hard: system design and architecture.
# --------------------------------------------------------------------------------------------

SYSTEM_DESIGN = [
    (
        H,
        ask(
            "Design a URL shortener that has to handle 100k writes/s and 1M reads/s globally, with custom aliases, expiry, and click analytics that can lag by a minute. Give the data model, ID generation, caching and how you'd shard.",
            max_tokens=4096,
        ),
    ),
    (
        H,
        ask(
            "We need a multi-tenant job scheduler: tenants submit jobs with priorities, no tenant may starve others, jobs can be retried, and each job's side effect (charging a card) must happen exactly once even if workers crash. How would you build it on Postgres + a queue?"
        ),
    ),
    (
        H,
        ask(
            "Our Postgres primary is 2 TB, write-heavy (about 15k TPS at peak), and read replicas lag up to 30 s at peak so users don't see their own writes. We can't rewrite the app this quarter. What are our options, in what order would you try them, and what would you measure first?"
        ),
    ),
    (
        H,
        ask(
            "For a collaborative rich-text editor (like Google Docs) with offline editing on mobile, should we use CRDTs or OT? Walk through how each handles concurrent formatting changes and deletes, and what the server has to store."
        ),
    ),
    (
        H,
        ask(
            "Architect a real-time leaderboard for a game with 50M players: global top 100, each player's own rank, and friends-only leaderboards, updated within a second of a match ending."
        ),
    ),
    (
        H,
        ask(
            "How would you move user authentication out of our Rails monolith into a separate service with zero downtime and without logging anyone out? Sessions are currently in Redis, passwords are bcrypt in the main DB."
        ),
    ),
    (H, ask("How do you get exactly-once processing on top of SQS standard queues?")),
    (
        H,
        ask(
            "We want a 5-node metadata store spread over 3 regions (us-east, eu-west, ap-south). Raft or multi-Paxos or something leaderless? Give expected write latency with real inter-region RTTs and how placement of nodes changes it."
        ),
    ),
    (
        H,
        ask(
            "Design the feature store for our fraud models: batch features from the warehouse, streaming features from Kafka, serving at p99 < 10 ms, and training sets that are point-in-time correct."
        ),
    ),
    (
        H,
        ask(
            "and what happens to in-flight transfers if the coordinator dies between prepare and commit? do we need 3PC?",
            history=[
                (
                    "We're splitting our ledger into per-currency services. A transfer between currencies touches two services. How do we keep balances consistent?",
                    "You have two broad options: a distributed transaction (two-phase commit across the two services' databases) or a saga (local transactions plus compensating actions, coordinated by an orchestrator). Given the services own separate databases, a saga with idempotent steps and an outbox is usually preferred.",
                ),
                (
                    "we'd prefer 2PC for simplicity, the DBs are both Postgres",
                    "Postgres supports PREPARE TRANSACTION, so an external coordinator can run 2PC. You need a durable coordinator log and a recovery process.",
                ),
            ],
        ),
    ),
    (
        H,
        ask(
            "Estimate the GPU fleet needed to serve a 70B chat model at 2,000 requests/s, average 1,500 prompt tokens and 300 output tokens, p95 time-to-first-token under 1 s, on H100s. State your assumptions about throughput per GPU and batching."
        ),
    ),
    (
        H,
        ask(
            "Our Kafka consumer group (40 consumers, 120 partitions) goes into rebalancing storms several times a day and lag spikes to millions. Consumers do slow DB writes per message. What's likely happening and how do we fix it for good?"
        ),
    ),
]


# --------------------------------------------------------------------------------------------
# Hard: analysing long documents (needs cross-referencing, not just skimming).
# --------------------------------------------------------------------------------------------

SUPPLY_CONTRACT = """SUPPLY AGREEMENT (extract)

1. Definitions
1.1 "Products" means the injection-moulded housings described in Schedule A.
1.2 "Delivery Date" means the date stated in each Purchase Order, which shall be no earlier than 21 days after the Supplier's acceptance of that Purchase Order.
1.3 "Force Majeure Event" means any event beyond the reasonable control of the affected party, including fire, flood, war, epidemic and governmental action, but excluding the acts or omissions of a party's subcontractors unless the subcontractor is itself affected by an event that would be a Force Majeure Event.

2. Orders
2.1 The Buyer shall issue Purchase Orders in writing. A Purchase Order is accepted when the Supplier confirms it in writing or begins performance, whichever is earlier.
2.2 The Supplier may reject a Purchase Order within 3 Business Days of receipt. A Purchase Order not rejected within that period is deemed accepted.

3. Delivery
3.1 The Supplier shall deliver the Products DAP (Incoterms 2020) to the Buyer's facility in Eindhoven on the Delivery Date.
3.2 If the Supplier fails to deliver on the Delivery Date, the Supplier shall pay liquidated damages of 0.5% of the value of the late Products for each full week of delay, up to a maximum of 5% of that value.
3.3 Liquidated damages under clause 3.2 are the Buyer's sole and exclusive remedy for late delivery, except where the delay exceeds 8 weeks, in which case the Buyer may also terminate the affected Purchase Order under clause 9.2.
3.4 Title and risk in the Products pass to the Buyer on delivery.

4. Subcontracting
4.1 The Supplier may subcontract the manufacture of components, including tooling, without the Buyer's consent, provided that the Supplier remains responsible for all acts and omissions of its subcontractors as if they were its own.

5. Quality
5.1 The Supplier warrants that the Products will conform to the Specification for 12 months from delivery.
5.2 The Buyer shall inspect the Products within 10 Business Days of delivery and notify visible defects within that period; otherwise the Products are deemed accepted as to visible defects.

6. Price and Payment
6.1 Prices are fixed for the Initial Term, except that the Supplier may pass on increases in the cost of resin exceeding 10% over the Reference Price with 30 days' written notice.
6.2 The Buyer shall pay within 60 days of the invoice date.

7. Force Majeure
7.1 Neither party is liable for delay or failure to perform caused by a Force Majeure Event, provided that it notifies the other party within 5 Business Days of becoming aware of it.
7.2 If a Force Majeure Event continues for more than 6 weeks, either party may terminate the affected Purchase Orders without liability.

8. Limitation of Liability
8.1 Neither party is liable for loss of profit, loss of production, or any indirect or consequential loss.
8.2 Each party's total liability in any contract year is limited to 100% of the amounts paid or payable under this Agreement in that year.
8.3 Nothing in this Agreement limits liability for fraud, or for death or personal injury caused by negligence.

9. Termination
9.1 Either party may terminate this Agreement on 6 months' written notice.
9.2 The Buyer may terminate any Purchase Order with immediate effect if delivery is more than 10 weeks late.

10. Governing law: the laws of the Netherlands."""

POSTMORTEM = """Incident 2024-05-17: checkout errors (draft postmortem)

Summary: Between 14:02 and 14:51 UTC, 18% of checkout requests failed with HTTP 502. Root cause: the 14:00 deploy of cart-service v2.31 introduced a slow query that exhausted the database connection pool. Resolution: rollback at 14:49.

Timeline (UTC)
14:00  cart-service v2.31 deploy starts (canary 10%)
14:00  payment-gateway certificate rotation job runs (scheduled weekly)
14:02  first 502s on /checkout, alert fires at 14:05
14:06  on-call notices elevated DB connections on cart-db, suspects the deploy
14:10  canary promoted to 100% by the automated pipeline (error budget check uses the previous 5 min, which were clean)
14:25  DB connections back to normal levels; 502s continue at the same rate
14:31  on-call finds slow query in v2.31 (missing index on cart_items.session_id), creates index
14:40  502 rate unchanged
14:49  rollback of cart-service to v2.30
14:51  502s stop

Selected log lines
14:02:11 checkout-api ERROR upstream payment-gateway: TLS handshake failed: certificate verify failed (unable to get local issuer certificate)
14:02:11 checkout-api WARN  returning 502 to client, upstream=payment-gateway
14:06:40 cart-service WARN  pool: 48/50 connections in use
14:24:58 cart-service INFO  pool: 12/50 connections in use
14:33:02 checkout-api ERROR upstream payment-gateway: TLS handshake failed: certificate verify failed (unable to get local issuer certificate)
14:49:30 deployer INFO  rollback cart-service v2.31 -> v2.30 started (includes config bundle cfg-884)
14:49:31 deployer INFO  config bundle cfg-884: restoring ca-bundle.pem for checkout-api sidecar
14:51:02 checkout-api INFO  upstream payment-gateway: connection established

Notes
- v2.31 was deployed together with config bundle cfg-885, which updated the CA bundle used by the checkout-api sidecar.
- 502s were only on requests that reach the payment step; cart views were slow but returned 200."""

FINANCIALS = """Nordlicht Outdoor AG - selected figures (EUR thousands)

Income statement                      2023        2022
Revenue                            184,200     161,900
Cost of goods sold                 (109,300)   (93,100)
Gross profit                        74,900      68,800
Operating expenses                 (51,600)    (47,200)
Depreciation and amortisation       (8,100)     (6,900)
Operating profit (EBIT)             15,200      14,700
Net finance costs                   (3,900)     (1,800)
Profit before tax                   11,300      12,900
Income tax                          (3,200)     (3,600)
Net income                           8,100       9,300

Cash flow statement                   2023        2022
Net income                           8,100       9,300
Depreciation and amortisation        8,100       6,900
Increase in inventories            (21,400)     (4,200)
Increase in trade receivables       (6,700)     (2,100)
Increase in trade payables           9,800       1,900
Other operating items                  600         400
Cash from operating activities      (1,500)     12,200
Capital expenditure                (14,300)     (9,800)
Acquisition of Bergwerk GmbH        (22,000)          -
Cash from investing activities     (36,300)     (9,800)
Proceeds from borrowings            40,000       5,000
Dividends paid                      (4,000)     (4,000)
Cash from financing activities      36,000       1,000

Notes: Bergwerk GmbH was acquired on 1 October 2023 and contributed revenue of 6,800 in Q4. Inventory includes 7,200 of winter collection stock that was delivered late (January 2024 sales). The revolving credit facility carries a floating rate of Euribor + 2.5% and a covenant of net debt / EBITDA below 3.0x. Net debt at year end was 61,000 (2022: 23,500)."""

STUDY = """Title: Standing desks improve productivity in software teams: a field study

Abstract: We report a 12-week study at a mid-sized software company in which 40 developers received standing desks. Productivity, measured as merged pull requests per developer per week, increased by 23% compared with the 12 weeks before the intervention (p < 0.01). Self-reported back pain decreased. We conclude that standing desks substantially increase developer productivity and recommend their adoption.

Methods: Developers volunteered for the programme after an internal announcement; 40 of the 112 developers in the engineering department volunteered and all received desks in early March. The comparison period was the 12 weeks from December to February; the intervention period ran from March to May. Merged pull requests were extracted from GitHub. In April the company moved from a monthly release train to continuous deployment, and the engineering handbook was updated to recommend "small, frequent pull requests". Back pain was measured with a single question ("Has your back pain improved?") in a survey sent to participants at the end of the study; 31 of 40 responded and 24 answered yes. A paired t-test compared each developer's mean weekly PRs between the two periods. Developers who left the programme (n = 6, mostly citing discomfort) were excluded from the analysis.

Results: Mean merged PRs per week rose from 3.9 (SD 1.7) to 4.8 (SD 2.1). The effect was largest in the backend team (+41%), whose lead was the programme's sponsor."""

LEAVE_POLICY = """Parental Leave Policy (version 3.2, effective 1 January 2024)

1. Scope. This policy applies to all employees with a permanent or fixed-term contract of at least 12 months. Contractors and interns are not covered.

2. Eligibility. To receive enhanced parental pay (section 4), an employee must have completed 26 weeks of continuous service by the end of the 15th week before the expected week of childbirth, or by the date of placement in the case of adoption. Employees who do not meet this requirement are entitled to statutory leave and pay only.

3. Leave. Eligible employees may take up to 52 weeks of parental leave. Leave must start no earlier than 11 weeks before the expected week of childbirth. For adoption, leave may start up to 14 days before the expected placement date.

4. Enhanced pay. Eligible employees receive full pay for the first 16 weeks of leave and half pay for the following 10 weeks. Enhanced pay is conditional on the employee returning to work for at least 6 months after the end of their leave; otherwise the enhanced portion above statutory pay must be repaid pro rata.

5. Part-time employees receive enhanced pay pro rata to their contracted hours averaged over the 12 weeks before leave starts.

6. Shared leave. Where both parents work for the company, the 16 weeks of full pay may be shared between them, but the total may not exceed 16 weeks per child.

7. Service. Periods of unpaid leave of more than 4 weeks do not count toward continuous service. Transfers from a subsidiary within the group count as continuous service.

8. Multiple births do not increase the leave or pay entitlements."""

PR_DIFF = """```diff
--- a/app/routes/files.py
+++ b/app/routes/files.py
@@ -1,20 +1,52 @@
-from flask import Blueprint, send_file, abort
+import os
+import subprocess
+import pickle
+from flask import Blueprint, send_file, abort, request, session
 from app.auth import login_required
+from app.db import db

 bp = Blueprint("files", __name__)
-BASE = "/srv/uploads"
+BASE = "/srv/uploads"
+PREVIEW_CACHE = "/tmp/previews"

 @bp.get("/files/<int:file_id>")
 @login_required
 def download(file_id):
-    f = File.query.get_or_404(file_id)
-    if f.owner_id != session["user_id"]:
-        abort(403)
-    return send_file(f.path)
+    f = File.query.get_or_404(file_id)
+    return send_file(f.path)
+
+@bp.get("/files/by-name")
+@login_required
+def by_name():
+    name = request.args["name"]
+    return send_file(os.path.join(BASE, session["user_id"], name))
+
+@bp.post("/files/<int:file_id>/preview")
+@login_required
+def preview(file_id):
+    f = File.query.get_or_404(file_id)
+    size = request.form.get("size", "256x256")
+    out = os.path.join(PREVIEW_CACHE, f"{file_id}.png")
+    subprocess.run(f"convert {f.path} -resize {size} {out}", shell=True, check=True)
+    return send_file(out)
+
+@bp.post("/files/import-settings")
+@login_required
+def import_settings():
+    settings = pickle.loads(request.files["settings"].read())
+    db.session.execute(
+        f"UPDATE users SET theme = '{settings['theme']}' WHERE id = {session['user_id']}"
+    )
+    db.session.commit()
+    return {"ok": True}
```"""

SALES_TABLE = """region,quarter,revenue_local,currency,units,notes
DACH,2023Q1,4120000,EUR,10300,
DACH,2023Q2,4380000,EUR,10950,
DACH,2023Q3,3990000,EUR,9975,
DACH,2023Q4,5210000,EUR,13025,
DACH,2024Q1,4480000,EUR,10980,
DACH,2024Q2,4710000,EUR,11300,
UK,2023Q1,2210000,GBP,6500,
UK,2023Q2,2350000,GBP,6910,
UK,2023Q3,2190000,GBP,6440,
UK,2023Q4,2770000,GBP,8150,
UK,2024Q1,2460000,GBP,7020,price increase of 5% from Jan 2024
UK,2024Q2,2540000,GBP,7100,
Nordics,2023Q1,18900000,SEK,4200,
Nordics,2023Q2,19600000,SEK,4350,
Nordics,2023Q3,18200000,SEK,4050,
Nordics,2023Q4,24100000,SEK,5350,
Nordics,2024Q1,2310000,EUR,4900,reporting currency changed from SEK to EUR in 2024
Nordics,2024Q2,2290000,EUR,4850,
Iberia,2023Q1,1480000,EUR,4100,
Iberia,2023Q2,1610000,EUR,4470,
Iberia,2023Q3,1720000,EUR,4780,
Iberia,2023Q4,1950000,EUR,5420,
Iberia,2024Q1,1500000,EUR,4170,Q1 2024 excludes Portugal (distributor change; Portugal was about 20% of Iberia)
Iberia,2024Q2,1710000,EUR,4750,Portugal back from April 2024

Average exchange rates: 2023: 1 GBP = 1.15 EUR, 1 EUR = 11.47 SEK. 2024 H1: 1 GBP = 1.17 EUR, 1 EUR = 11.50 SEK."""

API_SPEC = """Orders API v2 (draft)

Authentication. Every request must carry an API key in the `Authorization: Bearer <key>` header. Keys are scoped to one merchant. Requests without a key receive 403 Forbidden.

Rate limits. Each key may make 600 requests per minute. Exceeding the limit returns 429 with a `Retry-After` header in milliseconds.

Idempotency. POST requests may include an `Idempotency-Key` header. A repeated request with the same key within 24 hours returns the original response. Keys are scoped per endpoint.

GET /orders
Returns orders, newest first. Pagination is cursor-based: pass the `next_cursor` value from the previous response as `cursor`. `limit` defaults to 50, maximum 200. Results can be filtered with `status` (one of `pending`, `paid`, `shipped`, `cancelled`) and `created_after` (Unix timestamp, seconds).

Response: `{ "data": [...], "next_cursor": "...", "total": 1234 }`. When there are no more results, `next_cursor` is omitted.

POST /orders
Creates an order. Amounts are integers in the smallest currency unit (e.g. cents). Returns 201 with the order. If the merchant has reached their daily order cap, returns 402.

POST /orders/{id}/cancel
Cancels an order. Only `pending` and `paid` orders can be cancelled; cancelling a `shipped` order returns 409. Cancelling an already cancelled order returns 200 with the order (idempotent).

Errors. All errors return `{ "error": { "code": "...", "message": "..." } }`. Authentication errors return 401 Unauthorized. Validation errors return 400 with `code = "invalid_request"`.

Order object
- `id` (string)
- `amount` (number, decimal, e.g. 12.50)
- `currency` (ISO 4217, lowercase)
- `status` (`pending` | `paid` | `shipped` | `canceled`)
- `created_at` (ISO 8601 timestamp, UTC)

Pagination (general). All list endpoints use page-based pagination with `page` and `per_page` (default 20, max 100).

Webhooks. We send `order.updated` events for every status change. Webhooks are retried with exponential backoff for up to 3 days. Your endpoint should return 200 within 5 seconds; deliveries are signed with HMAC-SHA256 of the body using your API key."""


LONG_DOCUMENT = [
    (
        H,
        ask(
            "We're the Buyer. Our supplier missed a delivery by 9 weeks because their tooling subcontractor's factory had a fire. They say it's force majeure and they owe nothing. What are our rights under this contract, and are there clauses that conflict with each other on this situation?\n\n"
            + SUPPLY_CONTRACT
        ),
    ),
    (
        H,
        ask(
            "Read this draft postmortem. Is the stated root cause consistent with the timeline and the logs? If not, what do you think actually happened, and what should the action items be?\n\n"
            + POSTMORTEM
        ),
    ),
    (
        H,
        ask(
            "Compute free cash flow for both years, explain why net income and operating cash flow diverge so much in 2023, and tell me whether the covenant is at risk. Show your numbers.\n\n"
            + FINANCIALS
        ),
    ),
    (
        H,
        ask(
            "I'm reviewing this for our internal journal club. Does the conclusion follow from the methods? List the methodological problems in order of how much they threaten the conclusion.\n\n"
            + STUDY
        ),
    ),
    (
        H,
        ask(
            "An employee joined us on 1 March 2024 after 3 years at our subsidiary, took 6 weeks of unpaid leave in May, works 3 days a week, and is expecting twins with a due date of 20 November 2024. Her partner also works here. What is she entitled to under this policy, and what is unclear?\n\n"
            + LEAVE_POLICY
        ),
    ),
    (
        H,
        ask(
            "Security review of this PR, please. List every vulnerability with severity and the fix.\n\n"
            + PR_DIFF
        ),
    ),
    (
        H,
        ask(
            "Which region had the strongest real growth in H1 2024 vs H1 2023? Adjust for currency and the notes, show the calculation, and say which comparisons are not like-for-like.\n\n"
            + SALES_TABLE
        ),
    ),
    (
        H,
        ask(
            "Before we publish this API doc: find every place where it contradicts itself or where two clients could reasonably implement it differently. Be specific.\n\n"
            + API_SPEC
        ),
    ),
    (
        H,
        ask(
            "Under this contract, can the supplier pass on a 15% resin price increase mid-term, and if we then pay 90 days late, what's our exposure? Walk through the relevant clauses.\n\n"
            + SUPPLY_CONTRACT,
            response_format=json_schema(
                "contract_answer", {"answer": STR, "clauses": STR_LIST, "risks": STR_LIST}
            ),
        ),
    ),
    (
        H,
        ask(
            "Based on these figures, what would net debt/EBITDA be if Bergwerk had been consolidated for the full year at the same quarterly run-rate and margin as the group? State your assumptions.\n\n"
            + FINANCIALS,
            max_tokens=1500,
        ),
    ),
]


# --------------------------------------------------------------------------------------------
# Hard: planning under many constraints.
# --------------------------------------------------------------------------------------------

PROJECT_TASKS = """Tasks (duration in days, prerequisites):
A  requirements        3   -
B  data model          4   A
C  API                 6   B
D  UI mockups          5   A
E  UI implementation   7   D, C
F  data migration      5   B
G  integration tests   4   E, F
H  security review     3   C
I  launch prep         2   G, H"""

PLANNING = [
    (
        H,
        ask(
            "Schedule these five 1-hour meetings this week (Mon-Fri) so that nobody has two meetings back to back and everything is inside everyone's working hours: (1) Ana+Ben+Chen, (2) Ben+Dara, (3) Ana+Chen+Eli, (4) Dara+Eli, (5) everyone. Ana is in Lisbon (9-17), Ben in New York (9-17), Chen in Singapore (9-18), Dara in Berlin (8-16, not Wednesdays), Eli in San Francisco (10-18). Meeting 5 must be after meetings 1-4. Give times in each person's local time, or explain why it's impossible."
        ),
    ),
    (
        H,
        ask(
            "Seat 10 wedding guests at two tables of 5. Constraints: Alice and Bob must sit together; Carol and Dave can't be at the same table; Eve must be with at least one of Frank or Grace but not both; Heidi sits with Ivan unless Judy is at their table; Bob and Grace are exes and can't be together. List all valid arrangements up to swapping the tables."
        ),
    ),
    (
        H,
        ask(
            "Make me a 7-day vegetarian meal plan: 2000 kcal/day (±100), at least 120 g protein per day, no nuts or soy, total grocery budget €60 for the week in Germany, and I only want to cook 3 times (batch cooking is fine). Give per-day macros and the shopping list with prices."
        ),
    ),
    (
        H,
        ask(
            "Plan 10 days in Japan in late March: arrive Tokyo Narita, leave from Osaka Kansai. Must be in Osaka on day 4 evening for a concert, want 2 nights in Kanazawa, one night in a ryokan in Hakone, no backtracking, and the JR pass only if it actually saves money at current prices. Give day-by-day routing with train times, and total rail cost with and without the pass."
        ),
    ),
    (
        H,
        ask(
            "Two developers work in parallel on these tasks (a task can't be split, and a developer does one task at a time). What's the earliest the project can finish, what's the critical path, and give a schedule that achieves it.\n\n"
            + PROJECT_TASKS
        ),
    ),
    (
        H,
        ask(
            "I need to pick courses for my last 3 semesters to graduate. I need 90 credits: CS401 (fall only, needs CS301), CS402 (spring only, needs CS401), CS410 (any, needs CS301 and MATH220), MATH220 (any), CS301 (fall only), an elective track of 2 of {CS420, CS430, CS440} where CS430 needs CS420 and CS440 is only offered in spring, plus 30 free credits. Each course is 6 credits except free ones; max 36 credits per semester. Next semester is spring. Is it possible? Give the plan."
        ),
    ),
    (
        H,
        ask(
            "Make a 4-week nurse rota for 7 nurses covering 3 shifts a day (early, late, night) with 2 nurses per shift: nobody works more than 5 shifts a week, no early shift right after a night, at least 2 consecutive days off per week, night shifts in blocks of 2-3, and Maria can't work weekends. Show it as a table and explain how you checked the constraints.",
            max_tokens=4096,
        ),
    ),
    (
        H,
        ask(
            "Find a 90-minute slot next week when all four of us are free, not before 10:00 in Berlin and not after 17:00 in New York, book it as 'Q3 planning', and then email everyone the agenda from my last message.",
            tools=CALENDAR_TOOLS,
            system="Today is Thursday 2024-06-13. The user is in Europe/Berlin. Attendees: user@acme.example (Berlin), lee@acme.example (New York), sam@acme.example (London), ravi@acme.example (Bangalore).",
            history=[
                (
                    "Agenda for the Q3 planning: 1) Q2 results 2) hiring plan 3) roadmap priorities 4) budget",
                    "Got it, I'll use that agenda when we schedule the meeting.",
                )
            ],
        ),
    ),
    (
        H,
        ask(
            "We have €50k of marketing budget for next quarter across search, social and podcasts. Last quarter's data: search €20k → 410 signups, social €15k → 260, podcasts €10k → 95. Each channel shows diminishing returns; assume signups ∝ spend^0.6 per channel. Each channel needs at least €5k to keep contracts. How should we split the budget to maximise signups, and how many should we expect?"
        ),
    ),
    (
        H,
        ask(
            "Book me the cheapest combination to get from Zurich to Lisbon and back next month: I must be in Lisbon from the 12th (meeting at 9:00) to the 15th (leave after 16:00), hotel within walking distance of Praça do Comércio, total under CHF 900, no flights that land after 22:00.",
            tools=TRAVEL_TOOLS,
            system="Today is 2024-06-03.",
        ),
    ),
]

# --------------------------------------------------------------------------------------------
# Logic puzzles: short. Famous ones an 8B model has memorised are easy; altered or genuinely
# multi-step ones are hard.
# --------------------------------------------------------------------------------------------

LOGIC_PUZZLE = [
    (
        E,
        ask(
            "A bat and a ball cost $1.10 in total. The bat costs $1.00 more than the ball. How much does the ball cost?"
        ),
    ),
    (
        E,
        ask(
            "If it takes 5 machines 5 minutes to make 5 widgets, how long would it take 100 machines to make 100 widgets?"
        ),
    ),
    (
        E,
        ask(
            "Three boxes are labelled apples, oranges and mixed, and all the labels are wrong. You can take one fruit from one box. How do you fix the labels?"
        ),
    ),
    (E, ask("A man pushes his car to a hotel and tells the owner he's bankrupt. Why?")),
    (E, ask("What has keys but can't open locks?")),
    (
        H,
        ask(
            "Sally has 3 brothers. Each of her brothers has 2 sisters. How many sisters does Sally have?"
        ),
    ),
    (
        H,
        ask(
            "A says 'B is a knave.' B says 'A and C are the same type.' C says nothing. Knights always tell the truth, knaves always lie. What is C?"
        ),
    ),
    (
        H,
        ask(
            "A farmer has to cross a river with a wolf, a goat and a cabbage. His boat can carry him and two of the three at once. The wolf eats the goat and the goat eats the cabbage if left alone without him. What's the minimum number of crossings?"
        ),
    ),
    (H, ask("Which is bigger, 9.11 or 9.9?", max_tokens=50)),
    (
        H,
        ask("If yesterday was two days before Friday, what day will it be the day after tomorrow?"),
    ),
    (H, ask("What's the angle between the hour and minute hands of a clock at 3:15?")),
    (
        H,
        ask(
            "Monty Hall, but the host doesn't know where the car is: he opens one of the other two doors at random and it happens to show a goat. Should you switch?"
        ),
    ),
    (
        H,
        ask(
            "You have 12 coins, one is counterfeit and is either heavier or lighter. With a balance scale and 3 weighings, find the coin and whether it's heavier or lighter. Give the full decision tree."
        ),
    ),
    (
        H,
        ask(
            "Five houses in a row, each a different colour, with owners of different nationalities who drink different drinks and keep different pets. The Brit lives in the red house. The Swede keeps dogs. The Dane drinks tea. The green house is immediately left of the white house. The green house's owner drinks coffee. The person in the middle house drinks milk. The Norwegian lives in the first house. The Norwegian lives next to the blue house. The owner of the yellow house keeps horses. The person who keeps cats lives next to the one who drinks water. The German lives in the green house. The Swede's neighbour on the right keeps birds. The Dane lives next to the person who keeps cats. Who keeps the fish?"
        ),
    ),
    (
        E,
        ask(
            "I'm taller than Priya but shorter than Omar. Lena is shorter than Priya. Omar is shorter than Kai, and Kai is shorter than Lena's brother, who is not Omar. Is Lena's brother the tallest of us all? Who is second-shortest?"
        ),
    ),
    (
        H,
        ask(
            "A snail climbs 3 m up a 20 m well each day and slides back 2 m each night, but on every 5th day it doesn't slide back. On which day does it get out?"
        ),
    ),
]

# --------------------------------------------------------------------------------------------
# Hard: careful reasoning and expert judgement (statistics, medicine, law, finance, physics).
# --------------------------------------------------------------------------------------------

KIDNEY_STONES = """Treatment A: small stones 81/87 successful, large stones 192/263 successful.
Treatment B: small stones 234/270 successful, large stones 55/80 successful."""

CAREFUL_REASONING = [
    (
        H,
        ask(
            "Which treatment should a hospital recommend for a new patient whose stone size is unknown until after treatment starts? Which for a patient with a known large stone? Explain the apparent contradiction in the data.\n\n"
            + KIDNEY_STONES
        ),
    ),
    (
        H,
        ask(
            "Our A/B test: variant B moved conversion from 4.10% to 4.42% with about 12,000 users per arm. We checked the dashboard every day and stopped on day 9 when p dropped below 0.05. The PM wants to ship. Is the result trustworthy, and what would you do instead?"
        ),
    ),
    (
        H,
        ask(
            "A customer asked us to delete all their data under GDPR Article 17. We're a German company and must keep invoices for 10 years under tax law, and the invoices contain their name and address. We also have their support chat logs and product usage analytics. What exactly can and must we delete, and what do we tell them?"
        ),
    ),
    (
        H,
        ask(
            "My dad is on warfarin (INR usually 2.5) and his doctor wants to add fluconazole for 2 weeks; he also takes ibuprofen for his knee. What are the interaction risks and what monitoring is normally recommended? I want to know what to ask at the appointment."
        ),
    ),
    (
        H,
        ask(
            "In our regression of house prices on size, the coefficient on 'number of bedrooms' is positive. When we add 'living area in m²' it becomes negative and significant. My colleague says that means more bedrooms make a house cheaper. Is that right? Explain what the coefficient means in each model."
        ),
    ),
    (
        H,
        ask(
            "I'm a US citizen living in Germany with €80k of freelance income. Should I use the Foreign Earned Income Exclusion or the Foreign Tax Credit, and how does self-employment tax interact with the US-Germany totalization agreement?"
        ),
    ),
    (
        H,
        ask(
            "A 10-year bond with a 3% annual coupon was bought at par. Yields rise from 3% to 5% overnight. What's the new price, the modified duration before the move, and why does the duration estimate of the price change differ from the actual change?"
        ),
    ),
    (
        H,
        ask(
            "Evaluate this argument and identify every hidden assumption: 'Countries with more smartphones per person have lower child mortality. Therefore aid agencies should hand out smartphones to reduce child mortality.'"
        ),
    ),
    (
        H,
        ask(
            "We observed that customers who contacted support churned less than those who didn't (8% vs 15%). The support director says support reduces churn by almost half and wants to double the team. What's wrong with that inference, and what data or experiment would answer the question?"
        ),
    ),
    (
        H,
        ask(
            "A wire carrying a current of 10 A runs along the axis of a long copper pipe (inner radius 1 cm, outer radius 1.5 cm) that carries 10 A in the opposite direction, uniformly distributed. Find the magnetic field at r = 0.5 cm, 1.2 cm and 2 cm."
        ),
    ),
    (
        H,
        ask(
            "How much lithium carbonate is needed to make 1 tonne of LiFePO4 cathode material if the process yield is 92% and the carbonate is 99.5% pure? Give the reaction you assume and the molar masses."
        ),
    ),
    (
        H,
        ask(
            "Our 90-day retention dropped from 41% to 33% for the March signup cohort. Figure out whether it is a real change in behaviour or a mix shift (country, acquisition channel, plan), using the warehouse. Tell me which queries you ran and what you concluded.",
            tools=SQL_TOOLS,
            system="You are a data analyst agent with read access to the warehouse (tables: users, signups, events, subscriptions). Inspect tables before querying them.",
        ),
    ),
]

# --------------------------------------------------------------------------------------------
# Hard: long-tail knowledge (short, no cues; a small model's recall is much weaker).
# --------------------------------------------------------------------------------------------

LONG_TAIL_FACTS = [
    (H, ask("Who won the 1987 Tour de France?", max_tokens=32)),
    (H, ask("Which Byzantine emperor issued the Ecloga, and roughly when?")),
    (H, ask("What's the maximum ATT_MTU for Bluetooth LE, and why is it that number?")),
    (H, ask("Who composed the opera 'Le roi d'Ys'?")),
    (
        H,
        ask(
            "What is the default value of random_page_cost in PostgreSQL, and when should you lower it?"
        ),
    ),
    (
        H,
        ask(
            "Which treaty ended the War of the Spanish Succession between France and Great Britain, and what did Britain get from Spain under it?"
        ),
    ),
    (
        H,
        ask(
            "What's the difference between the 'Hanse' and the 'Kontor' in the Hanseatic League, and name the four main Kontore."
        ),
    ),
    (H, ask("In the C++ memory model, what is a 'release sequence' and how did C++20 change it?")),
]


CATEGORIES: dict[str, list[tuple[str, Body]]] = {
    "small_talk": SMALL_TALK,
    "trivia": TRIVIA,
    "advice": ADVICE,
    "customer_support": CUSTOMER_SUPPORT,
    "rewriting": REWRITING,
    "translation": TRANSLATION,
    "summarisation": SUMMARISATION,
    "simple_code": SIMPLE_CODE,
    "simple_math": SIMPLE_MATH,
    "extraction": EXTRACTION,
    "classification": CLASSIFICATION,
    "creative": CREATIVE,
    "logic_puzzle": LOGIC_PUZZLE,
    "math_multistep": MATH_MULTISTEP,
    "proof": PROOF,
    "code_debugging": CODE_DEBUGGING,
    "code_nontrivial": CODE_NONTRIVIAL,
    "system_design": SYSTEM_DESIGN,
    "long_document": LONG_DOCUMENT,
    "planning": PLANNING,
    "careful_reasoning": CAREFUL_REASONING,
    "long_tail_facts": LONG_TAIL_FACTS,
}


def records() -> list[Body]:
    """One record per prompt, ids ``<category>-<nn>`` in the order written above."""
    return [
        {"id": f"{category}-{i:02d}", "label": label, "category": category, "body": body}
        for category, items in CATEGORIES.items()
        for i, (label, body) in enumerate(items, start=1)
    ]


def main() -> None:
    out = Path(__file__).with_name("tier_eval.jsonl")
    with out.open("w", encoding="utf-8") as f:
        for record in records():
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
